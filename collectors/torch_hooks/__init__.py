"""Step timing for any ``torch.nn.Module`` forward: prefill or decode, step start/end, kv_len, batch.

    h = instrument(model, recorder)       # every model(...) call becomes a `steps` row
    ...
    uninstrument(h)                       # or uninstrument(model)

Why not ``register_forward_pre_hook``: torch's hook dispatch alone costs
several µs per call (measured side by side in ``benchmarks/bench_hooks.py``),
more than the whole budget (≤ 2 µs per step). By default the timing function
takes the module's ``_compiled_call_impl`` slot, which ``Module.__call__``
checks before ``_call_impl``, and does what ``_call_impl`` does when nothing
hooks the module (call ``forward``), so an instrumented call runs no more
Python frames than a plain one; with hooks present or while ``torch.jit.trace``
records module scopes it times ``_call_impl`` itself. The common case
(``input_ids`` and a ``DynamicCache``) runs inline in that one frame. A compiled module (``model.compile()`` fills the
same slot) gets an instance-level ``forward`` wrapper instead (``method="wrap"``,
the way ``accelerate`` attaches its hooks); ``method="hooks"`` uses real torch
hooks for models whose ``forward`` must not be replaced.

On CPU the slot is the C object of :mod:`collectors.torch_hooks._cstep` when it
was built at install (it is optional: no compiler, no C slot): the same inline
path in C, writing each step as seven int64s into a buffer the writer drains.
Run between real forward passes, with the CPU caches cold, the Python slot adds
5-10 µs per step and the C one 1-2 µs (``benchmarks/RESULTS.md``). Anything
unusual goes from C to the same Python general path. ``TRACETOOL_PURE_PYTHON=1``
in the environment keeps the Python slot. CUDA-timed models always use the
Python slot: their events are resolved off the hot path anyway.

What a step records (never touching device values, so no GPU sync):

* ``q_len`` and ``batch`` from the input shape;
* ``kv_len`` = tokens in the cache before the call + ``q_len``, from CPU
  metadata (:mod:`collectors.torch_hooks.kv`), and last a counter of the tokens
  fed since the sequence began (static caches on CUDA keep their length on the
  device; reading it would block the host);
* prefill when ``q_len > 1`` or the cache was empty, else decode.

On CPU the step is timed with the wall clock. On CUDA a pair of CUDA events
is recorded on the current stream and a resolver thread maps them onto the
server clock once they complete (:mod:`collectors.torch_hooks.cuda`), so the
host never waits for the device.
"""

from __future__ import annotations

import array
import contextvars
import functools
import inspect
import itertools
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa

from collectors.recorder import NULL, Recorder, RequestHandle, now_ns
from collectors.torch_hooks.kv import cache_seq_len, input_shape, past_len
from tracetool.native import load_optional
from tracetool.schema import INT_NULL

#: Raw step records: (step_id, start_ns, end_ns, batch, q_len, kv_len, prefill) on CPU; on CUDA a
#: list that also holds the events, then the device-timed start and end once resolved.
_capture: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("tracetool_steps", default=None)
_CAPTURING_LOCK = threading.Lock()
_ATTR = "_tracetool_hooks"
_DYNAMIC_LAYER: dict[type, bool] = {}  # layer types whose length is keys.shape[-2]
_CACHE_KIND: dict[type, int] = {}  # 1: list of layers (>= 4.56), 2: 4.4x DynamicCache, 0: other


#: :mod:`collectors.torch_hooks._cstep` when available (tests set it to None for the Python slot)
_cstep: Any = load_optional("collectors.torch_hooks._cstep")
#: Step ids are unique within a process, so several instrumented models share one trace. With
#: the C slot, its counter (the slot takes ids from it without a call).
_STEP_IDS: Any = _cstep.step_ids if _cstep is not None else itertools.count(1)
#: How many capture() blocks are open in any thread: the hot path reads the context variable
#: only when some are (a custom loop that never captures skips it). With the C slot, a one-int
#: view of the C counter the slot reads.
_CAPTURING: Any = _cstep.capturing if _cstep is not None else array.array("q", [0])


def _cache_kind(cache: Any) -> int:
    if isinstance(getattr(cache, "layers", None), list):
        return 1
    names = {c.__name__ for c in type(cache).__mro__}
    if "DynamicCache" in names and isinstance(getattr(cache, "key_cache", None), list):
        return 2
    return 0


def _classify(cache: Any) -> tuple[int, type | None]:
    """How the C slot reads a cache of this type inline: ``(1, layer type)`` for a list of
    ``DynamicLayer`` s, ``(2, None)`` for a 4.4x ``DynamicCache``, ``(0, None)``: the general path.
    Raises when the cache cannot tell yet (no layers); the C slot asks again next call."""
    ct = type(cache)
    kind = _CACHE_KIND.get(ct)
    if kind is None:
        kind = _CACHE_KIND[ct] = _cache_kind(cache)
    if kind != 1:
        return kind, None
    t = type(cache.layers[0])
    d = _DYNAMIC_LAYER.get(t)
    if d is None:
        d = _DYNAMIC_LAYER[t] = t.__name__ == "DynamicLayer"
    return (1, t) if d else (0, None)


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
        self._sink: Any = recorder.sink("steps")
        self._counter = 0  # tokens fed since the sequence began (last-resort kv_len)
        self._fresh = True
        self._last: Any = None
        #: the C step slot once installed (it then holds the last step)
        self._slot: Any = None
        #: where the steps wait for the flusher, one of the two: the C slot's row buffer (the general
        #: path's rows go there too: one buffer, one cap; the sink holds the buffer, never the slot,
        #: so an uninstrumented model is not kept alive by the trace), or a list of raw steps
        #: (step_id, start, end, batch, q_len, kv_len, prefill) the flusher derives the columns of
        self._rows: Any = None
        self._feed: list[Any] = []
        if method == "call" and not cuda and _cstep is not None:
            self._rows = _cstep.StepRows(self._sink.max_pending_rows)
            self._sink.add_feed(self._rows, self._rows.take, _step_columns)
        else:
            self._feed = self._sink.tuple_feed(_step_columns)
        self._undo: list[Callable[[], None]] = []
        self._timer: Any = None
        if cuda:
            from collectors.torch_hooks.cuda import CudaStepTimer

            self._timer = CudaStepTimer(self._write_raw, recorder)
        self._forget_close = recorder.on_close(self.close)

    # -- public ---------------------------------------------------------------------------
    @property
    def accelerated(self) -> bool:
        """True when the C step slot times this module (see the module docstring)."""
        return self._slot is not None

    @property
    def last(self) -> Step | None:
        """The most recent step of this module (any thread)."""
        raw = self._last if self._slot is None else self._slot.last
        return None if raw is None else Step(raw)

    def new_sequence(self) -> None:
        """Say that the next call starts a new sequence (resets the last-resort kv counter)."""
        self._fresh = True
        self._counter = 0

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
        self.active = False
        if self._slot is not None:  # a pass-through from now on, if something still calls it
            self._slot.active = False
        for undo in reversed(self._undo):
            self.recorder.guard(undo, where="uninstrument")
        self._undo.clear()
        # the recorder lets go of this handle (and so of the module): what is pending is written now
        self._forget_close()
        self.recorder.guard(self.close, where="uninstrument")
        if self.module.__dict__.get(_ATTR) is self:
            del self.module.__dict__[_ATTR]

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def close(self) -> None:
        """Resolve and write what is pending (called when the recorder closes)."""
        if self._timer is not None:
            self._timer.close()

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None  # a deep-copied model is not instrumented (see _forward_of)

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        return _none, ()  # nor is a pickled one

    # -- the general path (anything the inline fast path does not handle) -------------------------
    def _pre(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int, int, bool]:
        shape = input_shape(args, kwargs)
        batch, q = shape if shape is not None else (1, 1)
        past = past_len(args, kwargs, q, batch)
        if past is None:  # only the device knows: count the tokens fed since the sequence began
            past = 0 if (self._fresh or q > 1) else self._counter
        self._fresh = False
        self._counter = past + q
        return batch, q, past + q, q > 1 or past == 0

    def _post(self, start: int, end: int, batch: int, q: int, kv: int, prefill: bool, events: Any) -> None:
        sid = next(_STEP_IDS)
        if events is None:
            raw: Any = (sid, start, end, batch, q, kv, prefill)
            self._write_raw(raw)
        else:
            raw = [sid, start, end, batch, q, kv, prefill, events, None, None]
            self._timer.finish(raw)
        self._last = raw
        if self._slot is not None:
            self._slot.last = raw
        cap = _capture.get()
        if cap is not None:
            cap.append(raw)

    def _write_raw(self, raw: Any) -> None:
        if self._rows is not None:  # the C slot's buffer (CPU only: raw is a plain step tuple)
            if not self._rows.push(raw):
                self._sink.dropped += 1
            return
        if len(self._feed) >= self._sink.max_pending_rows:
            self._sink.dropped += 1
            return
        if len(raw) > 7:  # CUDA: the device-timed start and end (null when the events never resolved)
            raw = (raw[0], INT_NULL if raw[8] is None else raw[8], INT_NULL if raw[9] is None else raw[9],
                   *raw[3:7])
        self._feed.append(raw)


def _step_columns(raws: list[Any] | bytes) -> dict[str, Any]:
    """``steps`` columns of raw step tuples, or of the C slot's packed rows (bytes of 7 native
    int64 per row), vectorised (on the flusher thread, not the host's), as Arrow arrays of the
    table's own types so that the writer has nothing left to cast."""
    raw = (np.frombuffer(raws, dtype=np.int64) if isinstance(raws, bytes)
           else np.array(raws, dtype=np.int64)).reshape(-1, 7)
    sid, start, end, batch, q, kv, pre = np.ascontiguousarray(raw.T)  # one pass, seven columns
    prefill = pre != 0
    return {"step_id": pa.array(sid, pa.int64()),
            "start_ns": _ns_array(start), "end_ns": _ns_array(end),
            "batch_size": pa.array(batch.astype(np.int32), pa.int32()),
            "prefill_tokens": pa.array(np.where(prefill, batch * q, 0).astype(np.int32), pa.int32()),
            "decode_tokens": pa.array(np.where(prefill, 0, batch).astype(np.int32), pa.int32()),
            "kv_tokens": pa.array(batch * kv, pa.int64())}


def _ns_array(v: np.ndarray) -> pa.Array:
    null = v == INT_NULL  # a CUDA step whose events never resolved
    return pa.array(v, pa.int64(), mask=null if null.any() else None)


def _none() -> None:
    return None


def _forward_of(h: HookHandle, orig: Callable[..., Any], via_call: bool) -> Callable[..., Any]:
    """The timing function: times each call inline; anything unusual takes the general path.

    ``via_call``: installed as the module's ``_compiled_call_impl``, the slot
    ``Module.__call__`` checks first, so it stands in for ``Module._call_impl``:
    with no module hooks and no tracing (what ``_call_impl`` checks too) it calls
    ``module.forward`` itself, one Python frame fewer than a forward wrapper under
    ``_call_impl``; otherwise it times ``_call_impl`` (hooks included). Else it is
    the instance ``forward`` and calls ``orig``.

    It is stored as a method bound to the module, so ``copy.deepcopy(model)``
    rebinds it to the copy, which then runs untimed.
    """
    target = h.module
    rec = h.recorder
    sink = h._sink
    feed = h._feed
    push = feed.append
    cap_rows = sink.max_pending_rows
    now = now_ns
    ids = _STEP_IDS
    cap_get = _capture.get
    capturing = _CAPTURING
    dynamic = _DYNAMIC_LAYER
    kinds = _CACHE_KIND
    timer = h._timer
    # the cache and first-layer types of the last call that took the inline path: one `is` each
    # on the next call, instead of the dictionary lookups that classify a type seen first
    fast_cache: Any = None
    fast_layer: Any = None
    tracer: Any = None  # torch.jit._trace, read only when via_call
    g_bpre = g_b = g_f = g_fpre = None
    if via_call:  # what Module._call_impl checks before calling forward directly
        tracer, (g_bpre, g_b, g_f, g_fpre) = _torch_call_checks()

    inner, general = _calls(h, orig, via_call)

    def forward(module: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal fast_cache, fast_layer
        if module is not target:  # a deep copy of the instrumented model
            if via_call:
                return module._call_impl(*args, **kwargs)
            return type(module).forward(module, *args, **kwargs)
        if not h.active or not rec._enabled:
            return inner(module, args, kwargs)
        start = now()
        try:
            x = args[0] if args else kwargs["input_ids"]
            batch, q = x.shape
            cache = kwargs.get("cache")
            if cache is None:
                cache = kwargs["past_key_values"]
            ct = type(cache)
            if ct is fast_cache and timer is None:
                l0 = cache.layers[0]
                if type(l0) is not fast_layer:
                    raise LookupError
                keys = l0.keys  # None before the first update: what get_seq_length() reads as 0
                past = 0 if keys is None else keys.shape[-2]
            else:
                kind = kinds.get(ct)
                if kind is None:
                    kind = kinds[ct] = _cache_kind(cache)
                if timer is not None or kind == 0:
                    raise LookupError
                if kind == 1:  # transformers >= 4.56 / 5.x: a list of layers
                    l0 = cache.layers[0]
                    t = type(l0)
                    d = dynamic.get(t)
                    if d is None:
                        d = dynamic[t] = t.__name__ == "DynamicLayer"
                    if not d:
                        raise LookupError
                    keys = l0.keys
                    past = 0 if keys is None else keys.shape[-2]
                    fast_cache, fast_layer = ct, t
                else:  # 4.4x DynamicCache: what its get_seq_length() reads
                    kc = cache.key_cache
                    shape: Any = kc[0].shape if kc else ()
                    past = shape[-2] if len(shape) > 1 else 0  # empty layers are 1-D placeholders
        except Exception:  # not the common case: the general path (never raises into the host)
            return general(module, start, args, kwargs)
        if not via_call:
            out = orig(*args, **kwargs)
        elif (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
              or module._backward_pre_hooks or g_bpre or g_b or g_f or g_fpre
              or tracer._trace_module_map is not None):
            out = module._call_impl(*args, **kwargs)
        else:  # what _call_impl does when nothing hooks the module (its own frame saved)
            out = module.forward(*args, **kwargs)
        end = now()
        try:
            kv = past + q
            prefill = q > 1 or past == 0
            sid = next(ids)
            raw = (sid, start, end, batch, q, kv, prefill)
            h._last = raw
            if capturing[0]:  # some thread is inside capture(): is it this one?
                cap = cap_get()
                if cap is not None:
                    cap.append(raw)
            if len(feed) < cap_rows:
                push(raw)
            else:
                sink.dropped += 1
        except Exception as e:
            rec.error("torch_hooks", e)
        return out

    if via_call:
        return types.MethodType(forward, target)
    functools.update_wrapper(forward, orig)
    del forward.__wrapped__  # type: ignore[attr-defined]
    try:  # inspect.signature(model.forward) stays the original's: transformers reads it
        sig = inspect.signature(orig)
        me = inspect.Parameter("__tracetool_self", inspect.Parameter.POSITIONAL_ONLY)
        forward.__signature__ = sig.replace(parameters=[me, *sig.parameters.values()])  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        pass
    return types.MethodType(forward, target)


def _torch_call_checks() -> tuple[types.ModuleType, tuple[Any, ...]]:
    """What decides whether calling ``forward`` directly is what ``Module._call_impl`` would do:
    torch's four global module hook dicts (mutated in place, never rebound) and the module
    ``torch.jit._trace``, whose ``_trace_module_map`` is set while ``trace_module`` (or the
    TorchScript ONNX exporter) records module scopes. Under tracing ``_call_impl`` calls
    ``_slow_forward``, which differs from ``forward`` only by pushing that scope, so the map, not
    the tracing state (a pybind11 call: ~0.8 µs more per step than the map when cold), is what
    needs checking."""
    import torch.jit._trace as tracer
    from torch.nn.modules import module as tm

    return tracer, (tm._global_backward_pre_hooks, tm._global_backward_hooks,
                    tm._global_forward_hooks, tm._global_forward_pre_hooks)


def _calls(h: HookHandle, orig: Callable[..., Any], via_call: bool
           ) -> tuple[Callable[[Any, tuple[Any, ...], dict[str, Any]], Any],
                      Callable[[Any, int, tuple[Any, ...], dict[str, Any]], Any]]:
    """``inner(module, args, kwargs)``: the call being timed (``orig``, or what ``_call_impl``
    does); ``general(module, start_ns, args, kwargs)``: the general path, for every call the
    inline paths (Python or C) do not handle: classify with :meth:`HookHandle._pre`, time
    ``inner``, record with :meth:`HookHandle._post`; a collector failure is counted, never raised."""
    rec = h.recorder
    timer = h._timer
    tracer: Any = None  # torch.jit._trace, read only when via_call
    g_bpre = g_b = g_f = g_fpre = None
    if via_call:
        tracer, (g_bpre, g_b, g_f, g_fpre) = _torch_call_checks()

    def inner(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not via_call:
            return orig(*args, **kwargs)
        if (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks or g_bpre or g_b or g_f or g_fpre
                or tracer._trace_module_map is not None):
            return module._call_impl(*args, **kwargs)
        return module.forward(*args, **kwargs)

    def general(module: Any, start: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            batch, q, kv, prefill = h._pre(args, kwargs)
            events = timer.start() if timer is not None else None
        except Exception as e:
            rec.error("torch_hooks", e)
            return inner(module, args, kwargs)
        out = inner(module, args, kwargs)
        try:
            h._post(start, now_ns(), batch, q, kv, prefill, events)
        except Exception as e:
            rec.error("torch_hooks", e)
        return out

    return inner, general


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


def _install_call(h: HookHandle, module: Any) -> None:
    if h._rows is None:  # no C slot here (not built, or CUDA timing): the Python one
        _set_on_instance(h, module, "_compiled_call_impl", _forward_of(h, module.forward, via_call=True))
        return
    tracer, global_hooks = _torch_call_checks()
    own_hooks = (module._forward_hooks, module._forward_pre_hooks, module._backward_hooks,
                 module._backward_pre_hooks)
    rec = h.recorder
    slot = _cstep.StepSlot(module, rec, _calls(h, module.forward, True)[1], _classify, vars(tracer),
                           own_hooks + global_hooks, _STEP_IDS, _capture, h._sink, _none, h._rows, rec.enabled)
    h._slot = slot
    h._undo.append(rec.on_switch(functools.partial(setattr, slot, "enabled")))
    _set_on_instance(h, module, "_compiled_call_impl", slot)


def _install_wrapper(h: HookHandle, module: Any) -> None:
    _set_on_instance(h, module, "forward", _forward_of(h, module.forward, via_call=False))


def _install_hooks(h: HookHandle, module: Any) -> None:
    local = threading.local()

    def pre_hook(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not h.active or not h.recorder.enabled:
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
        method: ``"call"`` (default, cheapest: the module's ``__call__`` dispatch,
            see :func:`_forward_of`; a module already compiled with
            ``Module.compile()`` gets ``"wrap"``), ``"wrap"`` (an instance-level
            ``forward`` wrapper) or ``"hooks"``
            (``register_forward_pre_hook``/``register_forward_hook``).
        cuda_timing: time with CUDA events; default: when the model's parameters are on CUDA.

    Instrumenting an instrumented model returns its existing handle. Compile
    (``model.compile()``) before instrumenting, not after: compiling replaces
    the ``__call__`` dispatch the ``"call"`` method uses.
    """
    existing = model.__dict__.get(_ATTR)
    if isinstance(existing, HookHandle) and existing.active:
        return existing
    if method not in ("call", "wrap", "hooks"):
        raise ValueError(f"method must be 'call', 'wrap' or 'hooks', not {method!r}")
    if method == "call" and (getattr(model, "_compiled_call_impl", False) is not None
                             or not callable(getattr(model, "_call_impl", None))):
        method = "wrap"  # compiled already, or not a torch Module
    cuda = _on_cuda(model) if cuda_timing is None else cuda_timing
    h = HookHandle(model, recorder, cuda=cuda, method=method)
    if method == "call":
        _install_call(h, model)
    elif method == "wrap":
        _install_wrapper(h, model)
    else:
        _install_hooks(h, model)
    model.__dict__[_ATTR] = h
    return h


def uninstrument(model_or_handle: Any) -> bool:
    """Remove every hook :func:`instrument` installed; True when something was removed."""
    h = model_or_handle if isinstance(model_or_handle, HookHandle) else getattr(model_or_handle, "__dict__", {}).get(_ATTR)
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
