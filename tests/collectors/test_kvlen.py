"""kv_len from CPU metadata across cache APIs, with constructed inputs (no model runs).

The classes named like transformers 4.4x caches below are test doubles of
those APIs (4.x is not installed here); the real 4.46 classes are exercised
by running this file under transformers 4.46 (see docs/collectors.md).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from collectors.torch_hooks.kv import cache_seq_len, input_shape, past_len


def kv(b: int, h: int, seq: int, d: int = 4) -> torch.Tensor:
    return torch.zeros(b, h, seq, d)


# -- legacy tuples -------------------------------------------------------------------------------
def test_legacy_tuple_of_key_value_pairs() -> None:
    cache = tuple((kv(1, 2, 7), kv(1, 2, 7)) for _ in range(3))
    assert cache_seq_len(cache) == 7
    assert past_len((), {"input_ids": torch.zeros(1, 1), "past_key_values": cache}, 1, 1) == 7


def test_legacy_bloom_layout_reads_the_value_sequence_axis() -> None:
    # Bloom: keys [b*h, head_dim, seq], values [b*h, seq, head_dim]
    cache = ((torch.zeros(4, 8, 11), torch.zeros(4, 11, 8)),)
    assert cache_seq_len(cache) == 11


def test_legacy_fused_tensor_per_layer() -> None:
    cache = (torch.zeros(1, 9, 16), torch.zeros(1, 9, 16))  # GPT-BigCode: one [b, seq, 2*d] per layer
    assert cache_seq_len(cache) == 9


def test_empty_legacy_cache_and_none() -> None:
    assert cache_seq_len(()) == 0
    assert cache_seq_len(None) == 0
    assert past_len((), {"input_ids": torch.zeros(1, 5), "past_key_values": None}, 5, 1) == 0


# -- transformers caches ----------------------------------------------------------------------------
def test_real_dynamic_cache_is_read_from_shapes() -> None:
    from transformers import DynamicCache

    cache = DynamicCache()
    assert cache_seq_len(cache) == 0
    for layer in range(2):
        cache.update(kv(1, 2, 5), kv(1, 2, 5), layer)
    assert cache_seq_len(cache) == 5
    # whichever kwarg name the installed transformers passes (5.x `cache`, 4.x `past_key_values`)
    for key in ("cache", "past_key_values"):
        assert past_len((), {"input_ids": torch.zeros(1, 1), key: cache}, 1, 1) == 5


class DynamicCache:
    """Double of transformers 4.4x DynamicCache: key_cache lists, shape-based get_seq_length, no `layers`."""

    def __init__(self, seq: int) -> None:
        self.key_cache = [kv(1, 2, seq)] if seq else []

    def get_seq_length(self, layer_idx: int = 0) -> int:
        if len(self.key_cache) <= layer_idx or len(self.key_cache[layer_idx]) == 0:
            return 0
        return int(self.key_cache[layer_idx].shape[-2])


class StaticCache:
    """Double of transformers 4.4x StaticCache: get_seq_length runs a reduction on the device."""

    calls = 0

    def get_seq_length(self, layer_idx: int = 0) -> Any:
        StaticCache.calls += 1
        raise AssertionError("a 4.x StaticCache.get_seq_length must not be called on the hot path")


def test_4x_dynamic_cache_via_past_key_values() -> None:
    assert past_len((), {"input_ids": torch.zeros(1, 1), "past_key_values": DynamicCache(12)}, 1, 1) == 12
    assert past_len((), {"input_ids": torch.zeros(1, 6), "past_key_values": DynamicCache(0)}, 6, 1) == 0


def test_4x_static_cache_is_never_asked_and_cache_position_is_used() -> None:
    StaticCache.calls = 0
    kwargs = {"input_ids": torch.zeros(1, 1), "past_key_values": StaticCache(),
              "cache_position": torch.tensor([20])}
    assert past_len((), kwargs, 1, 1) == 20
    prefill = {"input_ids": torch.zeros(1, 4), "past_key_values": StaticCache(),
               "cache_position": torch.arange(4)}
    assert past_len((), prefill, 4, 1) == 0
    assert StaticCache.calls == 0


def test_real_static_cache_on_cpu_is_read() -> None:
    from transformers import LlamaConfig
    from transformers import StaticCache as HFStatic

    cfg = LlamaConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      vocab_size=10)
    try:
        cache = HFStatic(config=cfg, max_cache_len=16)
    except TypeError:  # 4.x signature
        cache = HFStatic(config=cfg, max_batch_size=1, max_cache_len=16, device="cpu", dtype=torch.float32)
    k = torch.zeros(1, 2, 3, 4)
    cache.update(k, k, 0, {"cache_position": torch.arange(3)})
    n = past_len((), {"input_ids": torch.zeros(1, 1), "cache": cache, "past_key_values": cache,
                      "cache_position": torch.tensor([3])}, 1, 1)
    assert n == 3


class FakeDevice:
    type = "cuda"


class StaticLayer:
    """Double of a 5.x StaticLayer living on CUDA: its length is a device tensor."""

    is_initialized = True

    def __init__(self) -> None:
        self.keys = type("K", (), {"device": FakeDevice()})()

    def get_seq_length(self) -> Any:
        raise AssertionError("reading a CUDA length would sync the host")


class LayeredCache:
    def __init__(self, layer: Any) -> None:
        self.layers = [layer]


def test_static_layer_on_cuda_is_not_read_mask_width_is_used() -> None:
    kwargs = {"input_ids": torch.zeros(2, 1), "cache": LayeredCache(StaticLayer()),
              "attention_mask": torch.ones(2, 31)}
    assert past_len((), kwargs, 1, 2) == 30


def test_unknown_cache_without_other_signals_is_unknown() -> None:
    assert past_len((), {"input_ids": torch.zeros(1, 1), "cache": object()}, 1, 1) is None


# -- positions and masks -------------------------------------------------------------------------------
def test_attention_mask_width_when_no_cache_object() -> None:
    assert past_len((), {"input_ids": torch.zeros(3, 1), "attention_mask": torch.ones(3, 40)}, 1, 3) == 39


def test_4d_mask_is_ignored_and_position_ids_used_for_batch_one() -> None:
    kwargs = {"input_ids": torch.zeros(1, 1), "attention_mask": torch.ones(1, 1, 1, 64),
              "position_ids": torch.tensor([[17]])}
    assert past_len((), kwargs, 1, 1) == 17


def test_gpt_fast_style_input_pos() -> None:
    assert past_len((torch.zeros(1, 1),), {"input_pos": torch.tensor([41])}, 1, 1) == 41


def test_use_cache_false_means_no_past() -> None:
    assert past_len((), {"input_ids": torch.zeros(1, 9), "use_cache": False}, 9, 1) == 0


@pytest.mark.parametrize(("args", "kwargs", "shape"), [
    ((torch.zeros(2, 7, dtype=torch.long),), {}, (2, 7)),
    ((), {"input_ids": torch.zeros(1, 1)}, (1, 1)),
    ((), {"inputs_embeds": torch.zeros(3, 5, 16)}, (3, 5)),
    ((torch.zeros(4, dtype=torch.long),), {}, (1, 4)),
    ((), {}, None),
])
def test_input_shape(args: tuple[Any, ...], kwargs: dict[str, Any], shape: tuple[int, int] | None) -> None:
    assert input_shape(args, kwargs) == shape
