"""Continuous batching for transformers causal LMs: one decode forward for every running request.

Requests arrive and finish at different times and have different lengths, so
their KV caches are kept in one left-padded batch: per layer a key and a value
tensor ``[batch, heads, width, head_dim]``, an attention mask marking the
padding, and per-row position ids (RoPE sees each sequence's true positions).
A request is prefilled alone (batch 1), then its cache joins the batch; a
finished request's row is dropped and the padding every row shares is cut.
The batch's ``DynamicCache`` is rebuilt only when its membership changes; in
between, the model appends to it in place as it always does.

Greedy outputs equal those of running each request alone (tested); only
models whose cache is a transformers ``DynamicCache`` of full-attention layers
qualify (:func:`batchable`), others are decoded one request at a time.
"""

from __future__ import annotations

import inspect
from typing import Any


def _layers(cache: Any) -> list[tuple[Any, Any]] | None:
    """Per-layer (keys, values) tensors of a DynamicCache (transformers 5.x and 4.x)."""
    layers = getattr(cache, "layers", None)
    if isinstance(layers, list):
        out = []
        for layer in layers:
            if type(layer).__name__ != "DynamicLayer":
                return None  # sliding-window, quantized, static: not re-paddable here
            k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
            if k is None or v is None or getattr(k, "ndim", 0) != 4:
                return None
            out.append((k, v))
        return out
    keys, values = getattr(cache, "key_cache", None), getattr(cache, "value_cache", None)
    if isinstance(keys, list) and isinstance(values, list) and keys and keys[0].ndim == 4:
        return list(zip(keys, values, strict=True))
    return None


def _make_cache(data: list[tuple[Any, Any]]) -> Any:
    from transformers import DynamicCache

    if "ddp_cache_data" in inspect.signature(DynamicCache.__init__).parameters:
        return DynamicCache(ddp_cache_data=data)
    return getattr(DynamicCache, "from_legacy_cache")(tuple(data))  # noqa: B009 (transformers 4.x only)


def batchable(model: Any, cache: Any) -> bool:
    """Can requests of ``model`` (whose prefill gave ``cache``) share decode forwards?"""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    accepts = {"attention_mask", "position_ids"} <= set(params) or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return accepts and _layers(cache) is not None


class KVBatch:
    """The running requests' KV caches as one left-padded batch (see the module docstring)."""

    def __init__(self) -> None:
        self.members: list[Any] = []
        self.cache: Any = None
        self.mask: Any = None  # [batch, width] long: 1 = a real token, 0 = padding
        self._layers: list[tuple[Any, Any]] | None = None
        self._dirty = False

    def __len__(self) -> int:
        return len(self.members)

    def add(self, member: Any, cache: Any) -> None:
        """Join a request whose prefill (batch 1) produced ``cache``."""
        import torch

        new = _layers(cache)
        if new is None:
            raise ValueError("cache cannot be batched")
        length = new[0][0].shape[-2]
        mask = torch.ones(1, length, dtype=torch.long, device=new[0][0].device)
        layers = self._current()
        if layers is None or not self.members:
            self._layers, self.mask = new, mask
        else:
            width = max(self.mask.shape[1], length)
            self._layers = [(torch.cat([_lpad(k, width), _lpad(nk, width)]),
                             torch.cat([_lpad(v, width), _lpad(nv, width)]))
                            for (k, v), (nk, nv) in zip(layers, new, strict=True)]
            self.mask = torch.cat([_lpad_mask(self.mask, width), _lpad_mask(mask, width)])
        self.members.append(member)
        self._dirty = True

    def keep(self, keep: list[bool]) -> None:
        """Drop the rows whose flag is False (finished or cancelled requests)."""
        import torch

        if all(keep):
            return
        idx = [i for i, k in enumerate(keep) if k]
        self.members = [self.members[i] for i in idx]
        if not idx:
            self.cache = self.mask = self._layers = None
            self._dirty = False
            return
        layers = self._current()
        assert layers is not None
        sel = torch.tensor(idx, dtype=torch.long, device=self.mask.device)
        mask = self.mask.index_select(0, sel)
        real = mask.any(dim=0).nonzero()
        start = int(real[0]) if len(real) else 0  # padding every row shares
        self.mask = mask[:, start:]
        self._layers = [(k.index_select(0, sel)[:, :, start:], v.index_select(0, sel)[:, :, start:])
                        for k, v in layers]
        self._dirty = True

    def inputs(self, last_tokens: list[int], device: Any) -> dict[str, Any]:
        """Keyword arguments of the next decode forward (the cache goes in under the caller's name)."""
        import torch

        if self._dirty or self.cache is None:
            assert self._layers is not None
            self.cache = _make_cache(self._layers)
            self._layers = None
            self._dirty = False
        ones = torch.ones(len(self.members), 1, dtype=torch.long, device=self.mask.device)
        self.mask = torch.cat([self.mask, ones], dim=1)
        return {"input_ids": torch.tensor([[t] for t in last_tokens], dtype=torch.long, device=device),
                "attention_mask": self.mask,
                "position_ids": self.mask.sum(dim=1, keepdim=True) - 1}

    def advanced(self, cache: Any) -> None:
        """The forward returned ``cache`` (usually the same object, now one token wider)."""
        self.cache = cache

    def _current(self) -> list[tuple[Any, Any]] | None:
        if self._layers is not None:
            return self._layers
        return None if self.cache is None else _layers(self.cache)


def _lpad(t: Any, width: int) -> Any:
    import torch

    missing = width - t.shape[-2]
    if missing <= 0:
        return t
    pad = torch.zeros(*t.shape[:-2], missing, t.shape[-1], dtype=t.dtype, device=t.device)
    return torch.cat([pad, t], dim=-2)


def _lpad_mask(mask: Any, width: int) -> Any:
    import torch

    missing = width - mask.shape[1]
    if missing <= 0:
        return mask
    return torch.cat([torch.zeros(mask.shape[0], missing, dtype=mask.dtype, device=mask.device), mask], dim=1)
