"""The generation engine behind ``tracetool serve``: a scheduler on one worker thread.

Requests wait in a FIFO queue (a ``queue`` span from submission to admission)
until one of ``max_batch`` slots is free. Admitted requests are prefilled
(a forward over the prompt, ``prefill`` span ending when the first token
exists), then every iteration of the loop runs one decode forward for each
active request in turn, so requests join and leave between iterations
(continuous, iteration-level scheduling). Each forward runs at batch 1 with
the request's own KV cache: simple and correct for any causal LM, and
concurrency then shows as it does on a real server under load, each request's
inter-token latency growing with the number of requests sharing the engine.

Per token the engine records a ``tokens`` row (``kv_len`` = prompt length +
index, the forward's ``step_id``/times/batch) and turns it into text
incrementally (``detokenize`` spans). ``decode`` covers first token → last
token minus the detokenize work inside it, so the phases of one request add
up without double counting. Forward passes are timed by the collectors'
:func:`collectors.torch_hooks.instrument` (one ``steps`` row per forward);
when that is not available the engine times them itself.

The engine talks to the HTTP side through a callback per request, called on
the worker thread with ``("token", index, text)``, ``("done", finish_reason,
usage)`` or ``("error", message)``.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tracetool.notices import say_once
from tracetool.recorder import NULL, Recorder, RequestHandle, now_ns
from tracetool.serving.batch import KVBatch, batchable
from tracetool.untrusted import clip

Event = tuple[Any, ...]


class Overloaded(Exception):
    """The waiting queue is full."""


@dataclass
class GenRequest:
    """One generation job. ``emit`` is called on the worker thread; it must not block."""

    handle: RequestHandle
    prompt_ids: list[int]
    max_tokens: int
    emit: Callable[[Event], None]
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    submitted_ns: int = 0
    cancelled: bool = False
    # worker-side state
    cache: Any = None
    generated: list[int] = field(default_factory=list)
    text: str = ""
    prefix_offset: int = 0
    read_offset: int = 0
    held: int = 0
    seg_start: int = 0
    generator: Any = None


class Engine:
    """Schedules :class:`GenRequest` s onto one model on a worker thread.

    Args:
        model: a causal LM taking ``input_ids``/``past_key_values`` (transformers style).
        tokenizer: its tokenizer (``decode``, ``eos_token_id``).
        recorder: the server's started Recorder.
        max_batch: requests decoded concurrently; more wait in the queue.
        max_waiting: queue length beyond which :meth:`submit` raises :class:`Overloaded`.
    """

    def __init__(self, model: Any, tokenizer: Any, recorder: Recorder, *, max_batch: int = 8,
                 max_waiting: int = 256) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.recorder = recorder
        self.max_batch = max_batch
        self.max_waiting = max_waiting
        self.device = _device_of(model)
        eos = getattr(tokenizer, "eos_token_id", None)
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.eos_ids = {i for i in _as_list(eos) + _as_list(gen_eos) if isinstance(i, int)}
        self._waiting: deque[GenRequest] = deque()
        self._batch = KVBatch()
        self._solo: list[GenRequest] = []
        #: decode running requests in one batched forward (decided at the first prefill)
        self.batching: bool | None = None
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._hooks: Any = None
        self._own_steps = itertools.count(1)
        #: requests taken from the queue and not yet in the batch (being prefilled)
        self._admitted = 0
        #: transformers 5 takes the KV cache as ``cache=``, 4.x as ``past_key_values=``
        self._cache_kw = "cache" if _accepts(model, "cache") else "past_key_values"
        self.tokens_generated = 0

    # -- lifecycle -----------------------------------------------------------------------
    def warm_up(self) -> None:
        """One tokenization, prefill and decode before serving: first calls pay one-time set-up
        (hundreds of ms on CPU) that must not land in the first request's numbers.
        Call it before :meth:`start`; its forwards are not recorded."""
        import torch

        ids = list(self.tokenizer("warm up the tokenizer")["input_ids"])[:8] or [1, 2, 3]
        self.tokenizer.decode(ids)
        with torch.inference_mode():
            _, cache, _ = self._forward_plain(ids, None)
            self._forward_plain(ids[:1], cache)

    def _forward_plain(self, ids: list[int], cache: Any) -> tuple[Any, Any, None]:
        import torch

        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = self.model(**{"input_ids": x, self._cache_kw: cache, "use_cache": True})
        return out.logits[0, -1], _cache_of(out), None

    def start(self) -> Engine:
        try:
            from collectors.torch_hooks import handle_of, instrument, uninstrument

            old = handle_of(self.model)
            if old is not None and old.recorder is not self.recorder:
                uninstrument(old)  # instrumented for another trace (a previous engine): ours now
            self._hooks = instrument(self.model, self.recorder)
        except Exception as e:  # the engine records its own steps then
            say_once("engine-hooks", f"torch hooks unavailable ({type(e).__name__}: {e}); "
                     "the engine times its forward passes itself")
            self._hooks = None
        self._thread = threading.Thread(target=self._run, name="tracetool-engine", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the worker; requests still waiting or running end with an error event."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._hooks is not None:
            from collectors.torch_hooks import uninstrument

            self.recorder.guard(uninstrument, self._hooks, where="engine close")
        with self._cv:
            left = list(self._waiting) + list(self._batch.members) + list(self._solo)
            self._waiting.clear()
        for r in left:
            _safe_emit(r, ("error", "server shutting down"))

    @property
    def load(self) -> tuple[int, int]:
        """(running, waiting) right now."""
        return self._running(), len(self._waiting)

    # -- HTTP side -------------------------------------------------------------------------
    def submit(self, req: GenRequest) -> None:
        """Queue a request (any thread). Raises :class:`Overloaded` when the queue is full."""
        with self._cv:
            if self._stop:
                raise Overloaded("server shutting down")
            # it would wait only if no batch slot is free for it once those ahead of it are admitted
            free = max(0, self.max_batch - self._running())
            if len(self._waiting) - free >= self.max_waiting:
                raise Overloaded(f"{len(self._waiting)} requests already waiting")
            req.submitted_ns = now_ns()
            self._waiting.append(req)
            self._cv.notify()

    def cancel(self, req: GenRequest) -> None:
        """Drop a request at the next iteration (its client went away)."""
        req.cancelled = True

    # -- worker ----------------------------------------------------------------------------
    def _run(self) -> None:
        import torch

        with torch.inference_mode():
            while True:
                with self._cv:
                    while not self._stop and not self._waiting and not self._running():
                        self._cv.wait()
                    if self._stop:
                        return
                    admitted: list[GenRequest] = []
                    while self._waiting and self._running() + len(admitted) < self.max_batch:
                        admitted.append(self._waiting.popleft())
                    self._admitted = len(admitted)  # they hold their slots while being prefilled
                for r in admitted:  # prefill newcomers, one at a time, then they join the batch
                    r.handle.add_span("queue", r.submitted_ns, now_ns())
                    if not r.cancelled and self._guard(r, self._prefill, r):
                        self._join(r)
                    self._admitted -= 1
                if self._batch:
                    self._decode_batch()
                for r in list(self._solo):
                    if r.cancelled or not self._guard(r, self._decode_solo, r):
                        r.cache = None
                        self._solo.remove(r)

    def _running(self) -> int:
        return len(self._batch) + len(self._solo) + self._admitted

    def _guard(self, r: GenRequest, fn: Callable[[GenRequest], bool], arg: GenRequest) -> bool:
        """Run a step of ``r``; a failure ends that request only. Returns True while it goes on."""
        try:
            return fn(arg)
        except Exception as e:
            self._fail(r, e)
            return False

    def _fail(self, r: GenRequest, e: Exception) -> None:
        self.recorder.error("engine", e)
        _safe_emit(r, ("error", clip(f"generation failed: {type(e).__name__}: {e}", 300)))

    def _join(self, r: GenRequest) -> None:
        """A prefilled request joins the decode batch (or the one-at-a-time list)."""
        if self.batching is None:
            self.batching = self.max_batch > 1 and batchable(self.model, r.cache)
            if not self.batching and self.max_batch > 1:
                say_once("engine-no-batching", "this model's KV cache cannot be batched here; "
                         "running requests are decoded one at a time (interleaved)")
        if self.batching:
            try:
                self._batch.add(r, r.cache)
                r.cache = None
                return
            except Exception as e:
                self.recorder.error("engine batch", e)
        self._solo.append(r)

    def _forward(self, kwargs: dict[str, Any], prefill: bool) -> tuple[Any, Any, Any]:
        """One forward; returns (output, the new cache, the captured step or its own timing)."""
        hooks = self._hooks
        if hooks is not None:
            with hooks.capture() as raw:
                out = self.model(**kwargs)
            return out, _cache_of(out), _Raw(raw[-1]) if raw else None
        x, mask = kwargs["input_ids"], kwargs.get("attention_mask")
        batch, q = int(x.shape[0]), int(x.shape[1])
        cache = kwargs.get(self._cache_kw)
        past = 0 if cache is None else int(cache.get_seq_length())  # before the call fills it
        kv = int(mask.sum()) if mask is not None else batch * (past + q)
        t0 = now_ns()
        out = self.model(**kwargs)
        t1 = now_ns()
        sid = next(self._own_steps)
        self.recorder.step(sid, t0, t1, batch_size=batch, prefill_tokens=batch * q if prefill else 0,
                           decode_tokens=0 if prefill else batch, kv_tokens=kv)
        return out, _cache_of(out), (sid, t0, t1, batch)

    def _single(self, ids: list[int], cache: Any) -> dict[str, Any]:
        import torch

        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        return {"input_ids": x, self._cache_kw: cache, "use_cache": True}

    def _prefill(self, r: GenRequest) -> bool:
        start = now_ns()
        out, r.cache, step = self._forward(self._single(r.prompt_ids, None), prefill=True)
        return self._emit_token(r, self._sample(r, out.logits[0, -1]), step, prefill_start=start)

    def _decode_solo(self, r: GenRequest) -> bool:
        out, r.cache, step = self._forward(self._single([r.generated[-1]], r.cache), prefill=False)
        return self._emit_token(r, self._sample(r, out.logits[0, -1]), step)

    def _decode_batch(self) -> None:
        """One decode forward over every batched request, then each one's token."""
        b = self._batch
        members = list(b.members)
        try:
            kwargs = b.inputs([r.generated[-1] for r in members], self.device)
            kwargs[self._cache_kw] = b.cache
            kwargs["use_cache"] = True
            out, cache, step = self._forward(kwargs, prefill=False)
            b.advanced(cache)
            logits = out.logits[:, -1]
        except Exception as e:
            for r in members:
                self._fail(r, e)
            b.keep([False] * len(members))
            return
        keep = []
        for i, r in enumerate(members):
            if r.cancelled:
                keep.append(False)
                continue
            try:
                keep.append(self._emit_token(r, self._sample(r, logits[i]), step))
            except Exception as e:
                self._fail(r, e)
                keep.append(False)
        b.keep(keep)

    def _sample(self, r: GenRequest, logits: Any) -> int:
        import torch

        if r.temperature <= 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.float() / r.temperature, dim=-1)
        if r.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < r.top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        if r.generator is None:
            r.generator = torch.Generator(device=probs.device)
            if r.seed is not None:
                r.generator.manual_seed(r.seed)
            else:
                r.generator.seed()
        return int(torch.multinomial(probs, 1, generator=r.generator))

    def _emit_token(self, r: GenRequest, tok: int, step: Any, prefill_start: int | None = None) -> bool:
        emit = now_ns()
        h = r.handle
        index = len(r.generated)
        r.generated.append(tok)
        self.tokens_generated += 1
        kv = len(r.prompt_ids) + index
        if isinstance(step, tuple):
            sid, s0, s1, batch = step
            h.token(index, kv, emit, s0, s1, batch, sid)
        elif step is not None:
            cols = step.cols
            if cols is None:  # the batch's first token: resolve the step once for all of them
                # after sampling read the logits, so on CUDA the step's events are complete; a failure
                # of the collectors (a CUDA event that cannot be read) costs the step columns, not the request
                steps = self.recorder.guard(self._hooks.steps, [step.raw], where="engine step")
                s = steps[0] if steps else None
                cols = step.cols = (NULL, NULL, NULL, NULL) if s is None else (
                    NULL if s.start_ns is None else s.start_ns, NULL if s.end_ns is None else s.end_ns,
                    s.batch, s.step_id)
            h.token(index, kv, emit, *cols)
        else:
            h.token(index, kv, emit)
        if prefill_start is not None:
            h.add_span("prefill", prefill_start, emit)
            r.seg_start = emit
        finish = self._finish_reason(r, tok)
        d0 = now_ns()
        delta = "" if (tok in self.eos_ids and not r.ignore_eos) else self._detokenize(r, final=finish is not None)
        if r.stop and delta:
            delta, hit = _cut_at_stop(r.text, delta, r.stop)
            if hit:
                finish = "stop"
        r.text += delta
        d1 = now_ns()
        h.add_span("detokenize", d0, d1)
        # decode = first token -> last token, less the detokenize work inside it
        if finish is None:
            h.add_span("decode", r.seg_start, d0)
            r.seg_start = d1
        elif index > 0:
            h.add_span("decode", r.seg_start, emit)
        _safe_emit(r, ("token", index, delta))
        if finish is None:
            return True
        h.output_tokens = len(r.generated)
        h.prompt_tokens = len(r.prompt_ids)
        usage = {"prompt_tokens": len(r.prompt_ids), "completion_tokens": len(r.generated),
                 "total_tokens": len(r.prompt_ids) + len(r.generated)}
        _safe_emit(r, ("done", finish, usage))
        r.cache = None
        return False

    def _finish_reason(self, r: GenRequest, tok: int) -> str | None:
        n = len(r.generated)
        if tok in self.eos_ids and not r.ignore_eos and n >= r.min_tokens:
            return "stop"
        if n >= r.max_tokens:
            return "length"
        return None

    def _detokenize(self, r: GenRequest, final: bool) -> str:
        """The new text of the last token (incremental, whole characters only).

        Decoding a window of ids and diffing it with the window before keeps
        tokenizers that merge spaces or bytes across tokens right; a token
        that ends inside a multi-byte character is held (up to 4 tokens) until
        the character is complete.
        """
        ids = r.generated
        if self.eos_ids and not r.ignore_eos:
            ids = [i for i in ids if i not in self.eos_ids]
        dec = self.tokenizer.decode
        prefix = dec(ids[r.prefix_offset:r.read_offset], skip_special_tokens=True)
        new = dec(ids[r.prefix_offset:], skip_special_tokens=True)
        if len(new) > len(prefix) and (not new.endswith("\ufffd") or final or r.held >= 4):
            r.prefix_offset, r.read_offset, r.held = r.read_offset, len(ids), 0
            return new[len(prefix):]
        r.held += 1
        return ""


class _Raw:
    """A captured raw step of the torch hooks, turned into the token rows' step columns once,
    after sampling, for every token of the batch (``cols``: None until then)."""

    __slots__ = ("cols", "raw")

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.cols: tuple[int, int, int, int] | None = None


def _cut_at_stop(text: str, delta: str, stops: list[str]) -> tuple[str, bool]:
    """``delta`` cut before the first stop string in ``text + delta`` (and whether one was found)."""
    full = text + delta
    cut = min((i for i in (full.find(s, max(0, len(text) - len(s) + 1)) for s in stops if s) if i >= 0),
              default=-1)
    if cut < 0:
        return delta, False
    return full[len(text):cut] if cut >= len(text) else "", True


def _safe_emit(r: GenRequest, event: Event) -> None:
    try:
        r.emit(event)
    except Exception as e:  # the HTTP side went away: nothing to tell
        say_once("engine-emit", f"could not deliver an engine event ({type(e).__name__}: {e})")


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def _accepts(model: Any, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _as_list(x: Any) -> list[Any]:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple, set)) else [x]


def _device_of(model: Any) -> Any:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError, TypeError):
        return "cpu"
