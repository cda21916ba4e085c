"""The demo model and tokenizer (no download), and the loader for a local model directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from collectors.demo import (
    DEMO_SHAPE,
    cache_dir,
    hardware_meta,
    load_demo_model,
    load_demo_tokenizer,
    load_model,
    model_meta,
)
from collectors.demo import tokenizer as demo_tok
from tracetool.errors import BadInput
from tracetool.meta import check_meta


@pytest.mark.slow
def test_same_seed_same_weights_other_seed_other_weights(tiny_shape: dict[str, int]) -> None:
    a, _ = load_demo_model(seed=3, **tiny_shape)
    b, _ = load_demo_model(seed=3, **tiny_shape)
    c, _ = load_demo_model(seed=4, **tiny_shape)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(pa, pb, msg=name)
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    assert a.config.model_type == "llama"


def test_seeding_leaves_the_callers_rng_alone(tiny_shape: dict[str, int]) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_demo_model(seed=0, **tiny_shape)
    torch.testing.assert_close(torch.rand(3), expected)


def test_tokenizer_round_trips_any_text(tiny: tuple[Any, Any]) -> None:
    tok = tiny[1]
    for text in ("The keeper wrote the time.", "Ünïcødé ✓ and emoji 🚀 and tabs\t!"):
        ids = tok.encode(text)
        assert tok.decode(ids) == text
    assert tok.eos_token == "</s>" and tok.pad_token == "<pad>" and tok.padding_side == "left"
    assert 500 < len(tok) <= demo_tok.VOCAB_SIZE


def test_tokenizer_is_cached_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACETOOL_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    first = load_demo_tokenizer()
    files = list((tmp_path / "c").glob("demo-bpe-*.json"))
    assert len(files) == 1

    def no_training(text: str) -> Any:
        raise AssertionError("the cached tokenizer should have been read")

    monkeypatch.setattr(demo_tok, "_train", no_training)
    second = load_demo_tokenizer()
    assert second.get_vocab() == first.get_vocab()


def test_unwritable_cache_still_gives_a_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TRACETOOL_CACHE", str(blocker / "sub"))
    from tracetool import notices

    notices.reset()
    tok = load_demo_tokenizer()
    assert tok.decode(tok.encode("bread")) == "bread"
    assert "demo tokenizer not cached" in capsys.readouterr().err


def test_demo_shape_and_meta() -> None:
    model, _ = load_demo_model()
    meta = model_meta(model)
    layers, kv_heads, head_dim = (DEMO_SHAPE[k] for k in ("num_hidden_layers", "num_key_value_heads", "head_dim"))
    assert (meta["layers"], meta["kv_heads"], meta["head_dim"]) == (layers, kv_heads, head_dim)
    assert meta["params"] == sum(p.numel() for p in model.parameters())
    assert meta["kv_bytes_per_token"] == 2 * layers * kv_heads * head_dim * 4  # fp32 cache
    assert meta["weight_bytes"] == meta["params"] * 4
    assert "seed 0" in meta["name"]
    hw = hardware_meta("cpu")
    assert hw["device"] == "cpu" and hw["gpu_count"] == 0
    check_meta({"format": "tracetool", "version": 1, "model": meta, "hardware": hw})


def test_load_model_from_a_local_directory(tmp_path: Path, tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    loaded, ltok = load_model(tmp_path / "m")
    enc = ltok("A river", return_tensors="pt")
    torch.testing.assert_close(loaded(**enc).logits, model(**enc).logits)
    assert ltok.padding_side == "left" and ltok.pad_token is not None
    assert model_meta(loaded)["name"] == "m"


def test_load_model_bad_directories(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"no config\.json"):
        load_model(tmp_path / "missing")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(BadInput, match="cannot load the model"):
        load_model(bad)
