"""Traced ``generate``: one request per batch row, a token row per generated token.

See :mod:`collectors.hf` for what is recorded. Token rows are built when
``generate`` returns (or raises), from the streamer's emit times and the steps
the forward wrapper captured, so the per-token path only appends to lists.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from collectors.torch_hooks import Step, handle_of, instrument
from tracetool.recorder import Recorder, current_request, now_ns
from tracetool.untrusted import clip

_local = threading.local()
#: The recorder :func:`collectors.hf.autopatch` traces every generate and tokenizer call into.
AUTO: dict[str, Any] = {"recorder": None, "undo": []}


@dataclass
class _Tokenize:
    start_ns: int
    end_ns: int
    chars: list[int]


@dataclass(eq=False)
class _Open:
    """A request whose ``server.request`` span waits for its last detokenize."""

    request_id: str
    start_ns: int
    end_ns: int
    prompt_tokens: int
    output_tokens: int
    prompt_chars: int | None
    status: str = "ok"
    error: str | None = None
    owned: bool = True


@dataclass(eq=False)
class _Last:
    """The last traced generate of a thread: which request a later decode belongs to."""

    requests: list[_Open]
    generated: list[list[int]]
    out_ptr: int = 0
    row_bytes: int = 0
    rows: int = 0
    #: ids generate pads a finished row with (pad_token_id, and the EOS ids it falls back on)
    pad_ids: frozenset[int] = frozenset()


class _Tracker:
    """HF bookkeeping of one Recorder: pending tokenizer calls, open requests, id counter."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.calls = 0
        self.lock = threading.Lock()
        self.open: list[_Open] = []
        self.models: set[int] = set()
        rec.on_close(self.finalize_all)

    def _thread(self) -> dict[str, Any]:
        d = getattr(_local, "by_rec", None)
        if d is None:
            d = _local.by_rec = {}
        return d.setdefault(id(self), {"pending": [], "last": None, "active": None})

    def new_ids(self, batch: int) -> list[str]:
        with self.lock:
            self.calls += 1
            n = self.calls
        return [f"gen{n}"] if batch == 1 else [f"gen{n}-{r}" for r in range(batch)]

    def finalize(self, opened: list[_Open]) -> None:
        rec = self.rec
        with self.lock:
            todo = [o for o in opened if o in self.open]
            for o in todo:
                self.open.remove(o)
        for o in todo:
            if o.owned:
                rec.add_span("server.request", o.start_ns, o.end_ns, request_id=o.request_id)
                rec.request_info(o.request_id, prompt_tokens=o.prompt_tokens, output_tokens=o.output_tokens,
                                 status=o.status, error=o.error, prompt_chars=o.prompt_chars)

    def finalize_all(self) -> None:
        with self.lock:
            todo = list(self.open)
        self.finalize(todo)


def _tracker(rec: Recorder) -> _Tracker:
    t = rec.__dict__.get("_tracetool_hf")
    if t is None:
        t = rec.__dict__["_tracetool_hf"] = _Tracker(rec)
    return t


def span_for(rec: Recorder, name: str, start_ns: int, end_ns: int, request_id: str) -> None:
    """A span of ``request_id``, through the current request's handle when it is that request
    (so its per-name durations, e.g. for Server-Timing, include it)."""
    cur = current_request()
    if cur is not None and cur.request_id == request_id:
        cur.add_span(name, start_ns, end_ns)
    else:
        rec.add_span(name, start_ns, end_ns, request_id=request_id)


# -- the streamer ----------------------------------------------------------------------------
_STREAMER: type | None = None


def token_times_streamer(chain: Any = None) -> Any:
    """A ``BaseStreamer`` that notes when each step's tokens reach the host, for every batch row.

    The first ``put`` is the prompt and is skipped; later puts hold one token
    per row (``[batch]``) or several (``[batch, k]``, assisted decoding).
    ``chain``: the caller's own streamer, called after us.
    """
    global _STREAMER
    if _STREAMER is None:
        from transformers.generation.streamers import BaseStreamer

        class TokenTimesStreamer(BaseStreamer):
            def __init__(self, chain: Any = None) -> None:
                self.chain = chain
                self.prompt_seen = False
                self.times: list[int] = []
                self.values: list[Any] = []
                #: failures of our own bookkeeping (counted by the recorder after generate)
                self.errors: list[BaseException] = []

            def put(self, value: Any) -> None:
                try:  # transformers calls this inside generate: our part must never raise into it
                    t = now_ns()
                    if self.prompt_seen:
                        self.times.append(t)
                        self.values.append(value)
                    else:
                        self.prompt_seen = True
                except Exception as e:
                    self.errors.append(e)
                if self.chain is not None:  # the caller's own streamer: its errors are the caller's
                    self.chain.put(value)

            def end(self) -> None:
                if self.chain is not None:
                    self.chain.end()

        _STREAMER = TokenTimesStreamer
    return _STREAMER(chain)


# -- generate -----------------------------------------------------------------------------------
def _input_ids(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0] if args else kwargs.get("inputs")
    if x is None:
        x = kwargs.get("input_ids")
    if x is None:
        x = kwargs.get("inputs_embeds")
    return x


def _eos_ids(model: Any, kwargs: dict[str, Any]) -> set[int]:
    eos: Any = kwargs.get("eos_token_id")
    gc = kwargs.get("generation_config")
    if eos is None and gc is not None:
        eos = getattr(gc, "eos_token_id", None)
    if eos is None:
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        return set()
    if hasattr(eos, "tolist"):
        eos = eos.tolist()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def _pad_ids(model: Any, kwargs: dict[str, Any]) -> set[int]:
    """The id generate fills finished rows with (none when unknown: it then pads with an EOS id)."""
    pad: Any = kwargs.get("pad_token_id")
    gc = kwargs.get("generation_config")
    if pad is None and gc is not None:
        pad = getattr(gc, "pad_token_id", None)
    if pad is None:
        pad = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
    if hasattr(pad, "tolist"):
        pad = pad.tolist()
    try:
        return {int(p) for p in (pad if isinstance(pad, (list, tuple)) else [pad]) if p is not None}
    except (TypeError, ValueError):
        return set()


def _num_beams(model: Any, kwargs: dict[str, Any]) -> int:
    n = kwargs.get("num_beams")
    if n is None and kwargs.get("generation_config") is not None:
        n = getattr(kwargs["generation_config"], "num_beams", None)
    if n is None:
        n = getattr(getattr(model, "generation_config", None), "num_beams", 1)
    return int(n or 1)


def traced_generate(model: Any, recorder: Recorder, *args: Any, request_ids: list[str] | None = None,
                    **kwargs: Any) -> Any:
    """``model.generate(*args, **kwargs)`` recorded into ``recorder`` (one request per batch row).

    ``request_ids``: ids for the rows (then the caller owns the requests: no
    ``server.request`` span or ``requests`` row is written for them). Without
    them, a batch-1 call inside ``recorder.request(...)`` uses that request;
    otherwise ids ``gen<N>`` / ``gen<N>-<row>`` are made up. Everything the
    model returns or raises passes through unchanged.
    """
    gen = model.__dict__.get("_tracetool_orig_generate") or model.generate
    return _traced(gen, model, recorder, args, kwargs, request_ids)


def _traced(call: Callable[..., Any], model: Any, rec: Recorder, args: tuple[Any, ...], kwargs: dict[str, Any],
            request_ids: list[str] | None) -> Any:
    tr = _tracker(rec)
    th = tr._thread()
    if not rec.enabled or th["active"] is not None:  # disabled, or a generate inside a traced one
        return call(*args, **kwargs)
    prep = rec.guard(_prepare, tr, th, model, args, kwargs, request_ids, where="hf generate")
    if prep is None:
        return call(*args, **kwargs)
    hooks, streamer, last = prep
    if streamer is not None:
        kwargs["streamer"] = streamer
    th["active"] = last
    err: BaseException | None = None
    out: Any = None
    raw: list[Any] = []
    try:
        with hooks.capture() as raw:
            out = call(*args, **kwargs)
        return out
    except BaseException as e:
        err = e
        raise
    finally:
        th["active"] = None
        rec.guard(_record, tr, th, hooks, model, args, kwargs, streamer, last, raw, out, err,
                  where="hf generate")


def _prepare(tr: _Tracker, th: dict[str, Any], model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
             request_ids: list[str] | None) -> tuple[Any, Any, _Last]:
    rec = tr.rec
    start = now_ns()
    if th["last"] is not None:  # the previous request cycle of this thread is over
        tr.finalize(th["last"].requests)
    x = _input_ids(args, kwargs)
    batch = int(x.shape[0]) if x is not None and len(x.shape) > 1 else 1
    owned = request_ids is None
    cur = current_request()
    if request_ids is None and cur is not None and batch == 1:
        request_ids, owned = [cur.request_id], False
    ids = list(request_ids) if request_ids is not None else tr.new_ids(batch)
    if len(ids) != batch:
        raise ValueError(f"request_ids has {len(ids)} ids for a batch of {batch}")
    pending: list[_Tokenize] = th["pending"]
    claims: list[_Tokenize | None] = [None] * batch
    if pending and len(pending[-1].chars) == batch:
        claims = [pending[-1]] * batch
    elif len(pending) >= batch and all(len(p.chars) == 1 for p in pending[-batch:]):
        claims = list(pending[-batch:])
    pending.clear()
    opened = []
    for r, rid in enumerate(ids):
        c = claims[r]
        if c is not None:
            span_for(rec, "tokenize", c.start_ns, c.end_ns, rid)
        chars = None if c is None else c.chars[r if len(c.chars) == batch else 0]
        opened.append(_Open(rid, start if c is None else min(c.start_ns, start), start, 0, 0, chars,
                            owned=owned))
    with tr.lock:
        tr.open.extend(opened)
    if id(model) not in tr.models:
        tr.models.add(id(model))
        _describe_model(rec, model)
    hooks = handle_of(model) or instrument(model, rec)
    hooks.new_sequence()
    streamer = None if _num_beams(model, kwargs) > 1 else token_times_streamer(kwargs.get("streamer"))
    last = _Last(opened, [[] for _ in ids])
    th["last"] = last
    return hooks, streamer, last


def _describe_model(rec: Recorder, model: Any) -> None:
    from collectors.demo.model import hardware_meta, model_meta

    meta = rec.writer.meta
    if meta.get("model") is None:
        device = getattr(model, "device", "cpu")
        rec.writer.update_meta(model=model_meta(model), hardware=hardware_meta(device))
    elif meta["model"].get("name") != getattr(model, "tracetool_name", None):
        rec.note("several models generated in this trace; meta.model describes the first")


def _record(tr: _Tracker, th: dict[str, Any], hooks: Any, model: Any, args: tuple[Any, ...],
            kwargs: dict[str, Any], streamer: Any, last: _Last, raw: list[Any], out: Any,
            err: BaseException | None) -> None:
    rec = tr.rec
    end = now_ns()
    for e in getattr(streamer, "errors", ())[:100]:
        rec.error("hf streamer", e)
    steps: list[Step] = hooks.steps(raw)  # on CUDA: waits for the events (generate has synced already)
    x = _input_ids(args, kwargs)
    batch = len(last.requests)
    width = int(x.shape[1]) if x is not None and len(x.shape) > 1 else (int(x.shape[0]) if x is not None else 0)
    mask = kwargs.get("attention_mask")
    if mask is not None and len(mask.shape) == 2 and int(mask.shape[0]) == batch:
        prompt = [int(v) for v in mask.sum(-1).tolist()]
    else:
        prompt = [width] * batch
    n_prefill = 0
    while n_prefill < len(steps) and steps[n_prefill].prefill:
        n_prefill += 1
    first = max(n_prefill, 1) - 1
    # per-row tokens: (emit_ns, token id or None)
    rows: list[list[tuple[int, int | None]]] = [[] for _ in range(batch)]
    if streamer is not None:
        for t, v in zip(streamer.times, streamer.values, strict=False):
            vals = v.tolist()
            for r in range(min(batch, len(vals))):
                toks = vals[r] if isinstance(vals[r], list) else [vals[r]]
                rows[r] += [(t, int(tok)) for tok in toks]
    else:  # beam search: no streamer allowed; a token per step, emitted at the step's end
        seq = getattr(out, "sequences", out)
        n = int(seq.shape[-1]) - width if seq is not None and hasattr(seq, "shape") else 0
        for i in range(max(n, 0)):
            s = steps[first + i] if first + i < len(steps) else None
            t = (s.end_ns or s.host_end_ns) if s is not None else end
            for r in range(batch):
                rows[r].append((t, None))
    eos = _eos_ids(model, kwargs)
    last.pad_ids = frozenset(eos | _pad_ids(model, kwargs))
    # encoder-decoder: the decoder attends over its own outputs, not the prompt; the convention does not apply
    enc_dec = bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))
    cols: dict[str, list[Any]] = {k: [] for k in ("request_id", "index", "emit_ns", "kv_len", "step_start_ns",
                                                  "step_end_ns", "batch_size", "step_id")}
    for r, (o, toks) in enumerate(zip(last.requests, rows, strict=True)):
        n = len(toks)
        for i, (_, tok) in enumerate(toks):
            if tok is not None and tok in eos:
                n = i + 1
                break
        toks = toks[:n]
        last.generated[r] = [t for _, t in toks if t is not None]
        for i, (t, _) in enumerate(toks):
            s = steps[first + i] if first + i < len(steps) else None
            cols["request_id"].append(o.request_id)
            cols["index"].append(i)
            cols["emit_ns"].append(t)
            cols["kv_len"].append(None if enc_dec else prompt[r] + i)
            cols["step_start_ns"].append(None if s is None else s.start_ns)
            cols["step_end_ns"].append(None if s is None else s.end_ns)
            cols["batch_size"].append(None if s is None else s.batch)
            cols["step_id"].append(None if s is None else s.step_id)
        first_start = steps[0].host_start_ns if steps else o.end_ns
        if toks:
            span_for(rec, "prefill", first_start, max(first_start, toks[0][0]), o.request_id)
            span_for(rec, "decode", toks[0][0], toks[-1][0], o.request_id)
        elif steps:
            span_for(rec, "prefill", first_start, max(first_start, steps[max(n_prefill, 1) - 1].host_end_ns),
                     o.request_id)
        o.end_ns = end
        o.prompt_tokens, o.output_tokens = prompt[r], len(toks)
        if err is not None:
            o.status, o.error = "error", clip(f"{type(err).__name__}: {err}", 500)
        if not o.owned:
            cur = current_request()
            if cur is not None and cur.request_id == o.request_id:
                cur.prompt_tokens = cur.prompt_tokens if cur.prompt_tokens is not None else prompt[r]
                cur.output_tokens = len(toks)
    if cols["index"]:
        rec.tokens(cols)
    seq = getattr(out, "sequences", out)
    if seq is not None and hasattr(seq, "data_ptr") and len(seq.shape) == 2:
        last.out_ptr, last.rows = int(seq.data_ptr()), int(seq.shape[0])
        last.row_bytes = int(seq.stride(0)) * int(seq.element_size())
    if err is not None:
        tr.finalize(last.requests)
        th["last"] = None


def wrap_generate(model: Any, recorder: Recorder) -> None:
    """Make ``model.generate`` record into ``recorder`` (instance-level; :func:`unwrap_generate` undoes)."""
    if "_tracetool_orig_generate" in model.__dict__:
        return
    orig = model.generate

    @functools.wraps(orig)
    def generate(*args: Any, **kwargs: Any) -> Any:
        return _traced(orig, model, recorder, args, kwargs, kwargs.pop("request_ids", None))

    model.__dict__["_tracetool_orig_generate"] = orig
    model.__dict__["generate"] = generate


def unwrap_generate(model: Any) -> None:
    orig = model.__dict__.pop("_tracetool_orig_generate", None)
    if orig is not None:
        model.__dict__.pop("generate", None)
