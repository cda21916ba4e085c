"""Step timing for any ``torch.nn.Module`` forward: prefill or decode, step start/end, kv_len, batch.

    h = instrument(model, recorder)       # every model(...) call becomes a `steps` row
    ...
    uninstrument(h)                       # or uninstrument(model)

One timing function, two ways to reach it:

* **the forward slot** (``method="call"``, the default): the timing function
  sits in the module's call slot, which ``Module.__call__`` runs before
  ``_call_impl`` (:func:`_take_call_slot`, the one place that touches that
  private part of torch). It reads the step, calls ``_call_impl`` (so the
  module's hooks, torch's global hooks and ``torch.jit.trace`` scopes behave
  exactly as without it) and records the step. A module compiled with
  ``model.compile()`` already uses the slot: it gets the same function as an
  instance-level ``forward`` instead (``method="wrap"``, the way
  ``accelerate`` attaches its hooks), as does anything that is not a torch
  Module, and any module on a torch that moved the slot;
* **plain hooks** (``method="hooks"``): ``register_forward_pre_hook`` and
  ``register_forward_hook``, public torch API, for a model whose call slot or
  ``forward`` must not be touched. Torch's hook dispatch costs more per call.

What either costs per decode step is measured by ``benchmarks/bench_hooks.py``
against the budget in ``docs/collectors.md`` (figures in
``benchmarks/RESULTS.md``).

What a step records (never touching device values, so no GPU sync):

* ``q_len`` and ``batch`` from the input shape;
* ``kv_len`` = tokens in the cache before the call + ``q_len``, from CPU
  metadata (:func:`collectors.torch_hooks.kv.past_len`), and last a counter of
  the tokens fed since the sequence began (static caches on CUDA keep their
  length on the device; reading it would block the host);
* prefill when ``q_len > 1`` or the cache was empty, else decode.

On CPU the step is timed with the wall clock. On CUDA a pair of CUDA events
is recorded on the current stream and a resolver thread maps them onto the
server clock once they complete (:mod:`collectors.torch_hooks.cuda`), so the
host never waits for the device.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import itertools
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from collectors.torch_hooks.kv import (
    SHAPE_LAYERS,
    cache_seq_len,
    input_shape,
    past_len,
)
from collectors.torch_hooks.rows import STEP_FIELDS, step_columns, token_columns
from tracetool.recorder import NULL, Recorder, RequestHandle, now_ns
from tracetool.schema import INT_NULL

#: Raw step records: (step_id, start_ns, end_ns, batch, q_len, kv_len, prefill) on CPU; on CUDA a
#: list that also holds the events, then the device-timed start and end once resolved.
_capture: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("tracetool_steps", default=None)
_CAPTURING_LOCK = threading.Lock()
_ATTR = "_tracetool_hooks"
#: Step ids are unique within a process, so several instrumented models share one trace.
_STEP_IDS: Any = itertools.count(1)
#: How many capture() blocks are open in any thread: a step reads the context variable only when
#: some are (a custom loop that never captures skips it). A list: its item is read by the
#: interpreter's own fast path, with no cold C code of another type to run.
_CAPTURING = [0]

#: The private part of torch the forward slot uses: ``Module.__call__`` runs
#: ``self._compiled_call_impl`` when it is set (``Module.compile()`` sets it) and
#: ``self._call_impl`` otherwise. Only :func:`_take_call_slot` reads these names;
#: ``tests/collectors/test_step_slot.py`` fails when an installed torch moved them.
_SLOT, _CALL_IMPL = "_compiled_call_impl", "_call_impl"


class Step:
    """One forward call, as :meth:`HookHandle.steps` and :attr:`HookHandle.last` give it.

    ``start_ns``/``end_ns`` are server clock (CUDA: device time mapped onto it;
    None until resolved). ``host_start_ns``/``host_end_ns`` are when the host
    entered and left ``forward``.
    """

    __slots__ = ("batch", "end_ns", "host_end_ns", "host_start_ns", "kv_len", "prefill", "q_len",
                 "start_ns", "step_id")

    def __init__(self, raw: Any) -> None:
        self.step_id, self.host_start_ns, self.host_end_ns, self.batch, self.q_len, self.kv_len, \
            self.prefill = raw[:7]
        resolved = len(raw) > 8 and raw[8] is not None
        self.start_ns: int | None = raw[8] if resolved else (self.host_start_ns if len(raw) == 7 else None)
        self.end_ns: int | None = raw[9] if resolved else (self.host_end_ns if len(raw) == 7 else None)

    def __repr__(self) -> str:
        kind = "prefill" if self.prefill else "decode"
        return (f"Step({self.step_id}, {kind}, batch={self.batch}, q_len={self.q_len}, "
                f"kv_len={self.kv_len}, start_ns={self.start_ns}, end_ns={self.end_ns})")


class HookHandle:
    """What :func:`instrument` returns: the live instrumentation of one module.

    Also a context manager: ``with instrument(model, rec): ...`` removes it on exit.
    """

    def __init__(self, module: Any, recorder: Recorder, *, cuda: bool, method: str) -> None:
        self.module = module
        self.recorder = recorder
        self.cuda = cuda
        self.method = method
        self.active = True
        #: active and recording (kept by :meth:`remove` and the recorder's switch, so a step reads
        #: no property); the timing function keeps its own copy, told through ``_on_changed``
        self._on: bool = recorder.enabled
        self._on_changed: list[Callable[[bool], None]] = []
        self._sink: Any = recorder.sink("steps")
        self._last: Any = None
        #: the last step before :meth:`new_sequence` (the last-resort kv_len counts from there)
        self._seq_start: Any = None
        #: raw steps (step_id, start, end, batch, q_len, kv_len, prefill) waiting for the flusher,
        #: which derives the table's columns from them (:func:`~collectors.torch_hooks.rows.step_columns`)
        self._feed: list[Any] = self._sink.tuple_feed(step_columns)
        #: tokens tied to a CPU step by :meth:`token`: (request code, index, emit_ns, the raw step)
        self._tokens: Any = recorder.sink("tokens")
        self._token_feed: list[Any] = self._tokens.tuple_feed(
            functools.partial(token_columns, strings=self._tokens.strings))
        self._token_cap: int = self._tokens.max_pending_rows
        self._undo: list[Callable[[], None]] = []
        self._timer: Any = None
        if cuda:
            from collectors.torch_hooks.cuda import CudaStepTimer

            self._timer = CudaStepTimer(self._write_raw, recorder)
        self._forget_close = recorder.on_close(self.close)
        self._forget_switch = recorder.on_switch(self._switch)

    # -- public ---------------------------------------------------------------------------
    @property
    def last(self) -> Step | None:
        """The most recent step of this module (any thread)."""
        raw = self._last
        return None if raw is None else Step(raw)

    def new_sequence(self) -> None:
        """Say that the next call starts a new sequence (resets the last-resort kv counter)."""
        self._seq_start = self._last

    @contextmanager
    def capture(self) -> Iterator[list[Any]]:
        """Collect the raw steps this thread/task runs inside the block; :meth:`steps` turns them into
        :class:`Step` objects afterwards (the hot path only appends a tuple)."""
        raw: list[Any] = []
        token = _capture.set(raw)
        with _CAPTURING_LOCK:
            _CAPTURING[0] += 1
        try:
            yield raw
        finally:
            with _CAPTURING_LOCK:
                _CAPTURING[0] -= 1
            _capture.reset(token)

    def steps(self, raw: list[Any], timeout_s: float = 5.0) -> list[Step]:
        """:class:`Step` objects of captured raw steps; on CUDA waits for their events first
        (call it off the hot path, e.g. when a request ends)."""
        if self._timer is not None:
            self._timer.resolve(raw, timeout_s)
        return [Step(r) for r in raw]

    def token(self, request: RequestHandle, index: int, kv_len: int | None = None, emit_ns: int = 0,
              step: Step | None = None) -> None:
        """Record token ``index`` of ``request`` tied to ``step`` (default: this module's last step).

        ``kv_len`` defaults to the step's kv_len (right for batch 1). On CUDA a step
        not yet resolved gives null step times; the ``step_id`` still ties the row.
        """
        raw = self._last
        if (type(raw) is tuple and step is None and kv_len is None and not emit_ns and type(index) is int
                and self._on and request.recorder is self.recorder):
            # a token of this module's last CPU step (a CUDA step is a list), now: one small tuple
            # that holds the step's own, for the flusher (rows.token_columns)
            feed = self._token_feed
            if len(feed) < self._token_cap:
                feed.append((request.code, index, now_ns(), raw))
            else:
                self._tokens.dropped += 1
            return
        s = step or self.last
        if s is None:
            request.token(index, NULL if kv_len is None else kv_len, emit_ns)
            return
        request.token(index, s.kv_len if kv_len is None else kv_len, emit_ns,
                      NULL if s.start_ns is None else s.start_ns, NULL if s.end_ns is None else s.end_ns,
                      s.batch, s.step_id)

    def remove(self) -> None:
        """Remove the instrumentation (see :func:`uninstrument`)."""
        if not self.active:
            return
        self.active = False  # a pass-through from now on, if something still calls the function
        self._set_on(False)
        self._forget_switch()
        for undo in reversed(self._undo):
            self.recorder.guard(undo, where="uninstrument")
        self._undo.clear()
        # the recorder lets go of this handle (and so of the module): what is pending is written now
        self._forget_close()
        self.recorder.guard(self.close, where="uninstrument")
        self._sink.end_feed(self._feed)
        self._tokens.end_feed(self._token_feed)
        if self.module.__dict__.get(_ATTR) is self:
            del self.module.__dict__[_ATTR]

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def _switch(self, enabled: bool) -> None:
        self._set_on(self.active and enabled)

    def _set_on(self, on: bool) -> None:
        self._on = on
        for fn in self._on_changed:
            fn(on)

    def close(self) -> None:
        """Resolve and write what is pending (called when the recorder closes)."""
        if self._timer is not None:
            self._timer.close()

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None  # a deep-copied model is not instrumented (see _timing_function)

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        return _none, ()  # nor is a pickled one

    # -- the step, before and after the call (both ways of reaching it) ---------------------------
    def _pre(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int, int, bool]:
        """(batch, q_len, kv_len, prefill) of a forward call, from CPU metadata only."""
        shape = input_shape(args, kwargs)
        batch, q = shape if shape is not None else (1, 1)
        past = past_len(args, kwargs, q, batch)
        if past is None:  # only the device knows: count the tokens fed since the sequence began
            last = self._last
            past = 0 if (q > 1 or last is self._seq_start) else last[5]
        return batch, q, past + q, q > 1 or past == 0

    def _post(self, start: int, end: int, batch: int, q: int, kv: int, prefill: bool, events: Any) -> None:
        """Record a step read by :meth:`_pre` (the hooks method, and CUDA steps; the timing
        function records a CPU step inline, the same way)."""
        sid = next(_STEP_IDS)
        if events is None:
            raw: Any = (sid, start, end, batch, q, kv, prefill)
            self._write_raw(raw)
        else:
            raw = [sid, start, end, batch, q, kv, prefill, events, None, None]
            self._timer.finish(raw)
        self._last = raw
        if _CAPTURING[0]:  # some thread is inside capture(): is it this one?
            cap = _capture.get()
            if cap is not None:
                cap.append(raw)

    def _write_raw(self, raw: Any) -> None:
        if len(self._feed) >= self._sink.max_pending_rows:
            self._sink.dropped += 1
            return
        if len(raw) > STEP_FIELDS:  # CUDA: the device-timed start and end (null when the events never resolved)
            raw = (raw[0], INT_NULL if raw[8] is None else raw[8], INT_NULL if raw[9] is None else raw[9],
                   *raw[3:7])
        self._feed.append(raw)


def _none() -> None:
    return None


def _timing_function(h: HookHandle, inner: Callable[..., Any]) -> Callable[..., Any]:
    """The one timing function: read the step, ``inner(*args, **kwargs)``, record it. A collector
    failure is counted on the recorder, never raised into the caller; the model's own errors pass
    through unchanged.

    It runs once per decode step, between forward passes that leave the CPU caches cold: there
    every bytecode, attribute and object it touches is fetched from far away, so it costs several
    times what a warm loop shows (the profile is in docs/collectors.md, the figure from
    benchmarks/bench_hooks.py). So the common step, a CPU model called with ``input_ids`` of shape
    [batch, q] and a transformers cache by name whose first layer is a ``DynamicLayer``, is read
    and recorded here in one frame and as few bytecodes as it takes (the layer as
    ``kv._dynamic_layer_len`` reads it); :meth:`HookHandle._pre` reads any other. CUDA steps
    are recorded by :meth:`HookHandle._post`.
    """
    rec = h.recorder
    timer = h._timer
    clock = now_ns

    # The flag as a variable of this closure: a step reads it without touching another object.
    on = h._on

    def switch(value: bool) -> None:
        nonlocal on
        on = value

    h._on_changed.append(switch)
    on = h._on  # again after registering: a switch meanwhile is not lost
    if timer is not None:
        def timed_cuda(*args: Any, **kwargs: Any) -> Any:
            if not on:
                return inner(*args, **kwargs)
            start = clock()
            try:
                batch, q, kv, prefill = h._pre(args, kwargs)
                events = timer.start()
            except Exception as e:
                rec.error("torch_hooks", e)
                return inner(*args, **kwargs)
            out = inner(*args, **kwargs)
            try:
                h._post(start, clock(), batch, q, kv, prefill, events)
            except Exception as e:
                rec.error("torch_hooks", e)
            return out

        return timed_cuda

    feed = h._feed
    cap = h._sink.max_pending_rows
    shape_layers = SHAPE_LAYERS
    ids, capturing = _STEP_IDS, _CAPTURING

    # Every free variable is touched on each call (the frame takes a reference to each cell), so
    # only what the common step uses is one; the rest is reached through ``h`` where it is needed.
    def timed(*args: Any, **kwargs: Any) -> Any:
        if not on:
            return inner(*args, **kwargs)
        start = clock()
        try:
            past = -1
            try:
                cache: Any = kwargs.get("cache")
                if cache is None:
                    cache = kwargs.get("past_key_values")
                # a list of layers whose first is a DynamicLayer: what kv._layered_len reads through
                # kv._dynamic_layer_len (the list's type is read from the object indexed next; no
                # cache, or one of another kind, takes the general reading without an exception)
                layers = getattr(cache, "layers", None)
                if type(layers) is list:
                    layer = layers[0]  # none yet: a first call, read below
                    if type(layer) in shape_layers:
                        batch, q = (args[0] if args else kwargs["input_ids"]).shape
                        _, _, past, _ = layer.keys.shape  # [batch, heads, seq, dim] once updated
            except Exception:
                past = -1
            if past < 0:  # not the common step: the general reading
                batch, q, kv, prefill = h._pre(args, kwargs)
            else:
                kv, prefill = past + q, q > 1 or past == 0
        except Exception as e:
            h.recorder.error("torch_hooks", e)
            return inner(*args, **kwargs)
        out = inner(*args, **kwargs)
        try:
            h._last = raw = (next(ids), start, clock(), batch, q, kv, prefill)
            if len(feed) < cap:
                feed.append(raw)
            else:
                h._sink.dropped += 1
            if capturing[0]:  # some thread is inside capture(): is it this one?
                captured = _capture.get()
                if captured is not None:
                    captured.append(raw)
        except Exception as e:
            h.recorder.error("torch_hooks", e)
        return out

    return timed


def _take_call_slot(h: HookHandle, module: Any) -> bool:
    """Put the timing function in ``module``'s call slot, to call ``module._call_impl`` in turn
    (hooks, tracing scopes, then ``forward``: what ``Module.__call__`` runs when the slot is
    empty). False, and nothing done, when there is no free slot: a compiled module fills it, a
    non-Module has none, and neither has a torch that moved these names.

    A copy of the module (``copy.deepcopy``, pickling) does not carry the slot: torch's
    ``Module.__getstate__`` leaves it out, as a copy of a compiled module is not compiled, so the
    copy is plain (``tests/collectors/test_torch_hooks.py`` checks both) and the function needs
    no binding to tell the copy from the original.

    The one function that uses torch's private call machinery (``_SLOT``, ``_CALL_IMPL``)."""
    if getattr(module, _SLOT, False) is not None or not callable(getattr(module, _CALL_IMPL, None)):
        return False
    _set_on_instance(h, module, _SLOT, _timing_function(h, getattr(module, _CALL_IMPL)))
    return True


def _install_wrapper(h: HookHandle, module: Any) -> None:
    """Put the timing function as ``module``'s instance ``forward``, keeping its signature
    (transformers reads ``inspect.signature(model.forward)``). It is bound to the module, so
    ``copy.deepcopy(model)`` rebinds it to the copy, which then runs the class's ``forward``."""
    orig = module.forward
    timed = _timing_function(h, orig)

    def forward(m: Any, *args: Any, **kwargs: Any) -> Any:
        if m is not module:  # a deep copy of the instrumented model
            return type(m).forward(m, *args, **kwargs)
        return timed(*args, **kwargs)

    functools.update_wrapper(forward, orig)
    del forward.__wrapped__  # type: ignore[attr-defined]
    try:
        sig = inspect.signature(orig)
        me = inspect.Parameter("__tracetool_self", inspect.Parameter.POSITIONAL_ONLY)
        forward.__signature__ = sig.replace(parameters=[me, *sig.parameters.values()])  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        pass
    _set_on_instance(h, module, "forward", types.MethodType(forward, module))


def _set_on_instance(h: HookHandle, module: Any, name: str, value: Any) -> None:
    """Put ``value`` in the module's instance dict under ``name``; removing the handle restores
    what was there, unless someone replaced ours since (torch.compile filling the call slot,
    another wrapper around the forward): then theirs stays, and ours, if still in their chain,
    is a pass-through once ``h.active`` is False."""
    had = name in module.__dict__
    before = module.__dict__.get(name)
    module.__dict__[name] = value

    def undo() -> None:
        if module.__dict__.get(name) is value:
            if had:
                module.__dict__[name] = before
            else:
                del module.__dict__[name]

    h._undo.append(undo)


def _install_hooks(h: HookHandle, module: Any) -> None:
    local = threading.local()

    def pre_hook(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not h._on:
            return
        start = now_ns()
        try:
            pre = h._pre(args, kwargs)
            events = h._timer.start() if h._timer is not None else None
            stack = getattr(local, "stack", None)
            if stack is None:
                stack = local.stack = []
            stack.append((start, *pre, events))
        except Exception as e:
            h.recorder.error("torch_hooks", e)

    def post_hook(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        stack = getattr(local, "stack", None)
        if not stack:
            return
        try:
            start, batch, q, kv, prefill, events = stack.pop()
            h._post(start, now_ns(), batch, q, kv, prefill, events)
        except Exception as e:
            h.recorder.error("torch_hooks", e)

    r1 = module.register_forward_pre_hook(pre_hook, with_kwargs=True)
    r2 = module.register_forward_hook(post_hook, with_kwargs=True)
    h._undo += [r1.remove, r2.remove]


def _on_cuda(module: Any) -> bool:
    try:
        p = next(module.parameters())
    except (StopIteration, AttributeError, TypeError):
        return False
    return bool(p.device.type == "cuda")


def instrument(model: Any, recorder: Recorder, *, method: str = "call", cuda_timing: bool | None = None) -> HookHandle:
    """Time every forward call of ``model`` as a ``steps`` row; returns the handle.

    Args:
        model: a ``torch.nn.Module`` (the top-level model whose calls are engine steps).
        recorder: a started :class:`~collectors.recorder.Recorder`.
        method: ``"call"`` (default: the module's call slot; a module already
            compiled with ``Module.compile()``, or anything that is not a torch
            Module, gets ``"wrap"``), ``"wrap"`` (an instance-level ``forward``
            wrapper) or ``"hooks"``
            (``register_forward_pre_hook``/``register_forward_hook``).
        cuda_timing: time with CUDA events; default: when the model's parameters are on CUDA.

    Instrumenting an instrumented model returns its existing handle. Compile
    (``model.compile()``) before instrumenting, not after: compiling replaces
    the call slot the ``"call"`` method uses.
    """
    existing = model.__dict__.get(_ATTR)
    if isinstance(existing, HookHandle) and existing.active:
        return existing
    if method not in ("call", "wrap", "hooks"):
        raise ValueError(f"method must be 'call', 'wrap' or 'hooks', not {method!r}")
    cuda = _on_cuda(model) if cuda_timing is None else cuda_timing
    h = HookHandle(model, recorder, cuda=cuda, method=method)
    if method == "call" and not _take_call_slot(h, model):
        h.method = method = "wrap"  # compiled already, or not a torch Module
    if method == "wrap":
        _install_wrapper(h, model)
    elif method == "hooks":
        _install_hooks(h, model)
    model.__dict__[_ATTR] = h
    return h


def uninstrument(model_or_handle: Any) -> bool:
    """Remove every hook :func:`instrument` installed; True when something was removed."""
    h = (model_or_handle if isinstance(model_or_handle, HookHandle)
         else getattr(model_or_handle, "__dict__", {}).get(_ATTR))
    if not isinstance(h, HookHandle) or not h.active:
        return False
    h.remove()
    return True


def handle_of(model: Any) -> HookHandle | None:
    """The active handle instrumenting ``model``, if any."""
    h = getattr(model, "__dict__", {}).get(_ATTR)
    return h if isinstance(h, HookHandle) and h.active else None


__all__ = ["HookHandle", "Step", "cache_seq_len", "handle_of", "input_shape", "instrument", "past_len",
           "uninstrument"]
