"""``tokenize`` and ``detokenize`` spans from a transformers tokenizer's encode and decode calls.

The methods are patched on the class (``__call__`` is looked up on the type,
so an instance attribute would not do), and act only for tokenizers given a
recorder by :func:`wrap_tokenizer` or while :func:`collectors.hf.autopatch`
is on; otherwise the cost is one dictionary lookup. A tokenizer call made
before ``generate`` is claimed by the next ``generate`` of the same thread; a
decode is matched to the rows of the last ``generate`` by tensor address or
content.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from collectors.hf.generate import AUTO, _Last, _local, _Tokenize, _tracker, span_for
from tracetool.recorder import Recorder, current_request, now_ns

#: Span name of tokenizer decodes made while ``generate`` runs (e.g. by a TextStreamer).
STREAM_DETOKENIZE = "stream.detokenize"


def _recorder_for(tok: Any) -> Recorder | None:
    rec = tok.__dict__.get("_tracetool_recorder") or AUTO.get("recorder")
    return rec if rec is not None and rec.enabled else None


def _texts(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int]:
    text = args[0] if args else kwargs.get("text")
    if isinstance(text, str):
        return [len(text)]
    if isinstance(text, (list, tuple)) and text and all(isinstance(t, str) for t in text):
        return [len(t) for t in text]
    return [0]


def _on_tokenize(rec: Recorder, start: int, end: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    cur = current_request()
    if cur is not None:
        cur.add_span("tokenize", start, end)
        return
    th = _tracker(rec)._thread()
    pending = th["pending"]
    pending.append(_Tokenize(start, end, _texts(args, kwargs)))
    del pending[:-64]


def _decode_rows(last: _Last, arg: Any) -> list[int]:
    """Rows of the last generate that a decode call reads (by tensor address, else by content)."""
    if hasattr(arg, "data_ptr") and last.row_bytes:
        ptr = int(arg.data_ptr())
        off = ptr - last.out_ptr
        if 0 <= off < last.rows * last.row_bytes:
            if len(arg.shape) >= 2:
                return list(range(len(last.requests)))
            return [min(off // last.row_bytes, len(last.requests) - 1)]
    if hasattr(arg, "tolist"):
        arg = arg.tolist()
    if isinstance(arg, (list, tuple)) and arg and isinstance(arg[0], (list, tuple)):
        return list(range(len(last.requests))) if len(arg) >= len(last.requests) else []
    if len(last.requests) == 1:
        return [0]
    if isinstance(arg, (list, tuple)):
        seq = list(arg)
        for r, gen in enumerate(last.generated):
            if gen and _ends_with(seq, gen, last.pad_ids):
                return [r]
    return []


def _ends_with(seq: list[Any], gen: list[int], pads: frozenset[int]) -> bool:
    """``seq`` ends with ``gen``, allowing the pads generate puts after a row that stopped on EOS
    (a batch row decoded from ``.tolist()``). The pad id may be the EOS id itself (SmolLM2's is):
    the pads are stripped one at a time, trying the match before each, so ``gen``'s own EOS stays."""
    k, n = len(seq), len(gen)
    while k >= n:
        if seq[k - n:k] == gen:
            return True
        if seq[k - 1] not in pads:
            return False
        k -= 1
    return False


def _on_detokenize(rec: Recorder, start: int, end: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    tr = _tracker(rec)
    th = tr._thread()
    active: _Last | None = th["active"]
    name = "detokenize"
    if active is not None:
        # a streamer decoding inside generate: that time is inside the decode span already, so it
        # gets a name the attribution does not add up as a phase (no double counting)
        targets, name = active.requests, STREAM_DETOKENIZE
    else:
        cur = current_request()
        if cur is not None:
            cur.add_span("detokenize", start, end)
            return
        last: _Last | None = th["last"]
        if last is None:
            return
        arg = args[0] if args else kwargs.get("token_ids", kwargs.get("sequences"))
        targets = [last.requests[r] for r in _decode_rows(last, arg)]
    for o in targets:
        span_for(rec, name, start, end, o.request_id)
        o.end_ns = max(o.end_ns, end)


_TOKENIZE_METHODS = ("__call__", "encode", "encode_plus", "batch_encode_plus")
_DETOKENIZE_METHODS = ("decode", "batch_decode")


def _patch_tokenizer_class(cls: type) -> list[Callable[[], None]]:
    undo: list[Callable[[], None]] = []
    for name in _TOKENIZE_METHODS + _DETOKENIZE_METHODS:
        orig = cls.__dict__.get(name)
        if orig is None or getattr(orig, "_tracetool", False):
            continue
        hook = _on_tokenize if name in _TOKENIZE_METHODS else _on_detokenize

        def make(orig: Any = orig, hook: Callable[..., None] = hook) -> Any:
            @functools.wraps(orig)
            def method(self: Any, *args: Any, **kwargs: Any) -> Any:
                rec = _recorder_for(self)
                if rec is None or getattr(_local, "tok_depth", False):
                    return orig(self, *args, **kwargs)
                _local.tok_depth = True
                start = now_ns()
                try:
                    return orig(self, *args, **kwargs)
                finally:
                    _local.tok_depth = False
                    rec.guard(hook, rec, start, now_ns(), args, kwargs, where="hf tokenizer")
            method._tracetool = True  # type: ignore[attr-defined]
            return method

        setattr(cls, name, make())
        undo.append(functools.partial(setattr, cls, name, orig))
    return undo


def wrap_tokenizer(tokenizer: Any, recorder: Recorder) -> None:
    """Record ``tokenize``/``detokenize`` spans for this tokenizer's encode and decode calls."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    _patch_tokenizer_class(PreTrainedTokenizerBase)
    for cls in type(tokenizer).__mro__:
        if cls is PreTrainedTokenizerBase:
            break
        _patch_tokenizer_class(cls)  # subclasses that override decode/encode
    tokenizer.__dict__["_tracetool_recorder"] = recorder


def unwrap_tokenizer(tokenizer: Any) -> None:
    """Stop recording this tokenizer's calls (the class patch stays, inert)."""
    tokenizer.__dict__.pop("_tracetool_recorder", None)
