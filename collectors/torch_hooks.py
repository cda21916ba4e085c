"""Step timing for any ``torch.nn.Module`` forward: prefill or decode, step start/end, kv_len, batch.

    h = instrument(model, recorder)       # every model(...) call becomes a `steps` row
    ...
    uninstrument(h)                       # or uninstrument(model)

Why a forward wrapper and not ``register_forward_pre_hook``: torch's hook
dispatch alone costs 2.5-4 µs per call on a small CPU box (measured in
``benchmarks/bench_hooks.py``), which is the whole budget (≤ 2 µs per step).
The wrapper is installed as an instance attribute, the way ``accelerate``
attaches its hooks, so ``Module.__call__`` keeps its hook-free fast path and
the wrapper adds one Python frame. ``method="hooks"`` uses real torch hooks
for models whose ``forward`` must not be replaced.

What a step records (never touching device values, so no GPU sync):

* ``q_len`` and ``batch`` from the input shape;
* ``kv_len`` = tokens in the cache before the call + ``q_len``, from CPU
  metadata: a ``DynamicCache`` (``get_seq_length()`` is a shape read), legacy
  tuple caches (a tensor shape), transformers 5.x ``cache=`` or 4.x
  ``past_key_values=``, then a 2-D ``attention_mask``'s width, then a CPU
  ``cache_position``/``input_pos``/``position_ids``, and last a counter of the
  tokens fed since the sequence began (static caches on CUDA keep their length
  on the device; reading it would block the host);
* prefill when ``q_len > 1`` or the cache was empty, else decode.

On CPU the step is timed with the wall clock. On CUDA a pair of CUDA events
is recorded on the current stream and a resolver thread maps them onto the
server clock once they complete, so the host never waits for the device.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from collectors.recorder import NULL, Recorder, RequestHandle, now_ns

#: Step ids are unique within a process, so several instrumented models share one trace.
_STEP_IDS = itertools.count(1)
_capture: contextvars.ContextVar[list[Step] | None] = contextvars.ContextVar("tracetool_steps", default=None)
_ATTR = "_tracetool_hooks"


class Step:
    """One forward call. ``start_ns``/``end_ns`` are server clock; on CUDA they stay
    None until the events are resolved (:meth:`HookHandle.resolve`)."""

    __slots__ = ("_events", "batch", "end_ns", "host_end_ns", "host_start_ns", "kv_len", "prefill",
                 "q_len", "start_ns", "step_id")

    def __init__(self, step_id: int, host_start_ns: int, host_end_ns: int, batch: int, q_len: int,
                 kv_len: int, prefill: bool) -> None:
        self.step_id = step_id
        self.host_start_ns = host_start_ns
        self.host_end_ns = host_end_ns
        self.start_ns: int | None = host_start_ns
        self.end_ns: int | None = host_end_ns
        self.batch = batch
        self.q_len = q_len
        self.kv_len = kv_len
        self.prefill = prefill
        self._events: tuple[Any, Any] | None = None

    def __repr__(self) -> str:
        kind = "prefill" if self.prefill else "decode"
        return (f"Step({self.step_id}, {kind}, batch={self.batch}, q_len={self.q_len}, "
                f"kv_len={self.kv_len}, start_ns={self.start_ns}, end_ns={self.end_ns})")


# -- kv_len from CPU metadata ------------------------------------------------------------
def _tensor_like(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "device")


def _legacy_len(cache: Any) -> int | None:
    """Legacy caches: a tuple per layer of (key, value) tensors [b, heads, seq, dim]
    (Bloom keeps keys as [b*h, dim, seq], so the value's seq axis is read), or one fused tensor."""
    if not cache:
        return 0
    e = cache[0]
    if e is None:
        return 0
    if _tensor_like(e):
        return int(e.shape[-2])
    if not e:
        return 0
    return int(e[1].shape[-2] if len(e) > 1 else e[0].shape[-2])


def _seq_len_value(n: Any) -> int | None:
    # 5.x static layers return a (possibly CUDA) tensor: read it only when it lives on the CPU
    if isinstance(n, int):
        return n
    if _tensor_like(n):
        return int(n) if n.device.type == "cpu" else None
    return None


def _layer_strategy(layer_type: type) -> Callable[[Any], int | None]:
    names = {c.__name__ for c in layer_type.__mro__}
    if "DynamicLayer" in names or "QuantizedLayer" in names or "BaseQuantizedLayer" in names:
        # shape reads or Python ints in every transformers version
        return lambda layer: _seq_len_value(layer.get_seq_length())
    if "StaticLayer" in names or "StaticSlidingWindowLayer" in names:
        # 4.5x computes on the device; 5.x returns a device tensor: CPU only
        def static(layer: Any) -> int | None:
            keys = getattr(layer, "keys", None)
            if not getattr(layer, "is_initialized", False) or keys is None:
                return 0
            if keys.device.type != "cpu":
                return None
            return _seq_len_value(layer.get_seq_length())
        return static
    return lambda layer: None


_LAYER_STRATEGIES: dict[type, Callable[[Any], int | None]] = {}


def _layered_len(cache: Any) -> int | None:
    layers = cache.layers
    if not layers:
        return 0
    layer = layers[0]
    f = _LAYER_STRATEGIES.get(type(layer))
    if f is None:
        f = _LAYER_STRATEGIES[type(layer)] = _layer_strategy(type(layer))
    return f(layer)


def _dynamic4_len(cache: Any) -> int | None:
    return _seq_len_value(cache.get_seq_length())


def _unknown_len(cache: Any) -> int | None:
    return None


def _cache_strategy(cache: Any) -> Callable[[Any], int | None]:
    if isinstance(cache, (tuple, list)):
        return _legacy_len
    if isinstance(getattr(cache, "layers", None), list):  # transformers >= 4.56 / 5.x Cache
        return _layered_len
    names = {c.__name__ for c in type(cache).__mro__}
    if "DynamicCache" in names:  # 4.4x: get_seq_length reads key_cache[0].shape
        return _dynamic4_len
    return _unknown_len  # e.g. a 4.x StaticCache: its get_seq_length runs on the device


_CACHE_STRATEGIES: dict[type, Callable[[Any], int | None]] = {}


def cache_seq_len(cache: Any) -> int | None:
    """Tokens already in ``cache`` read from CPU metadata, or None when only the device knows."""
    if cache is None:
        return 0
    f = _CACHE_STRATEGIES.get(type(cache))
    if f is None:
        f = _CACHE_STRATEGIES[type(cache)] = _cache_strategy(cache)
    return f(cache)


def _position_past(kwargs: dict[str, Any], q_len: int, batch: int) -> int | None:
    """Tokens before this call from a CPU position tensor (last position + 1 - q_len)."""
    for key in ("cache_position", "input_pos"):
        pos = kwargs.get(key)
        if pos is not None and _tensor_like(pos) and pos.device.type == "cpu" and pos.numel():
            return int(pos.reshape(-1)[-1]) + 1 - q_len
    pos = kwargs.get("position_ids")
    if pos is not None and batch == 1 and _tensor_like(pos) and pos.device.type == "cpu" and pos.numel():
        return int(pos.reshape(-1)[-1]) + 1 - q_len
    return None


def input_shape(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int] | None:
    """(batch, q_len) of a forward call, from ``input_ids``/``inputs_embeds`` shapes."""
    x = args[0] if args else kwargs.get("input_ids")
    if x is None:
        x = kwargs.get("inputs_embeds")
        if x is None:
            x = kwargs.get("decoder_input_ids")
        if x is None:
            return None
        return int(x.shape[0]), int(x.shape[1])
    shape = x.shape
    if len(shape) == 1:
        return 1, int(shape[0])
    return int(shape[0]), int(shape[1])


def _find_cache(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
    if "cache" in kwargs:
        return True, kwargs["cache"]
    if "past_key_values" in kwargs:
        return True, kwargs["past_key_values"]
    for a in args[1:]:  # positional use of a cache object (rare)
        if a is not None and (isinstance(a, tuple) or hasattr(a, "get_seq_length")):
            return True, a
    return False, None


def past_len(args: tuple[Any, ...], kwargs: dict[str, Any], q_len: int, batch: int) -> int | None:
    """Tokens already attended before this call, from CPU metadata only; None when unknown."""
    given, cache = _find_cache(args, kwargs)
    if cache is not None:
        n = cache_seq_len(cache)
        if n is not None:
            return n
    elif kwargs.get("use_cache") is False:
        return 0
    mask = kwargs.get("attention_mask")
    if mask is not None and _tensor_like(mask) and len(mask.shape) == 2:
        return int(mask.shape[-1]) - q_len
    n = _position_past(kwargs, q_len, batch)
    if n is not None:
        return n
    if given and cache is None:
        return 0
    return None


# -- CUDA event timing, resolved off the hot path ----------------------------------------------
class CudaStepTimer:
    """Times steps with CUDA events and maps them onto the server clock on a resolver thread.

    The hot path only records two events on the current stream. An *anchor*
    (an event recorded on an idle side stream, waited for on the resolver
    thread) ties device time to ``time.time_ns()``; it is refreshed every
    ``reanchor_s`` so clock drift and float32 ``elapsed_time`` rounding stay
    small. ``event_factory``/``side_stream`` exist for tests without a GPU.
    """

    def __init__(self, write: Callable[[Step], None], recorder: Recorder, *, reanchor_s: float = 1.0,
                 event_factory: Callable[[], Any] | None = None, side_stream: Any = None,
                 poll_s: float = 0.002) -> None:
        if event_factory is None:
            import torch

            def event_factory() -> Any:
                return torch.cuda.Event(enable_timing=True)

            side_stream = torch.cuda.Stream()
        self._new_event = event_factory
        self._side = side_stream
        self._write = write
        self._rec = recorder
        self._pool: list[Any] = []
        self._pending: deque[Step] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._poll_s = poll_s
        self._reanchor_s = reanchor_s
        self._anchor_ev, self._anchor_ns = self._make_anchor()
        self._anchor_at = time.monotonic()
        self._lock = threading.Lock()  # resolver thread vs resolve() from a caller
        self._thread = threading.Thread(target=self._run, name="tracetool-cuda-steps", daemon=True)
        self._thread.start()

    def _make_anchor(self) -> tuple[Any, int]:
        ev = self._new_event()
        t0 = now_ns()
        ev.record(self._side)
        ev.synchronize()  # resolver thread or set-up only; the side stream is idle, so this is µs
        t1 = now_ns()
        return ev, (t0 + t1) // 2

    # hot path ---------------------------------------------------------------------------
    def start(self) -> Any:
        ev = self._pool.pop() if self._pool else self._new_event()
        ev.record()
        return ev

    def finish(self, step: Step, start_ev: Any) -> None:
        ev = self._pool.pop() if self._pool else self._new_event()
        ev.record()
        step._events = (start_ev, ev)
        self._pending.append(step)
        if len(self._pending) == 1:
            self._wake.set()

    # resolver side ------------------------------------------------------------------------
    def _to_ns(self, ev: Any) -> int:
        return self._anchor_ns + round(self._anchor_ev.elapsed_time(ev) * 1e6)

    def _resolve_one(self, step: Step) -> None:
        events = step._events
        if events is None:
            return
        s, e = events
        step.start_ns = self._to_ns(s)
        step.end_ns = max(step.start_ns, self._to_ns(e))
        step._events = None
        self._pool += [s, e]
        self._write(step)

    def _drain(self, block: bool) -> None:
        with self._lock:
            while self._pending:
                step = self._pending[0]
                events = step._events
                if events is not None and not events[1].query():
                    if not block:
                        return
                    events[1].synchronize()
                self._pending.popleft()
                self._resolve_one(step)

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._pending:
                self._wake.wait(0.1)
                self._wake.clear()
            try:
                self._drain(block=False)
                if not self._pending and time.monotonic() - self._anchor_at > self._reanchor_s:
                    with self._lock:
                        self._anchor_ev, self._anchor_ns = self._make_anchor()
                        self._anchor_at = time.monotonic()
            except Exception as e:
                self._rec.error("cuda step timing", e)
                self._pending.clear()
            if self._pending:
                self._stop.wait(self._poll_s)

    def resolve(self, steps: list[Step], timeout_s: float = 5.0) -> None:
        """Resolve ``steps`` now (their events are waited for on the calling thread)."""
        deadline = time.monotonic() + timeout_s
        if any(s._events is not None for s in steps):
            try:
                self._drain(block=True)
            except Exception as e:
                self._rec.error("cuda step timing", e)
        while any(s._events is not None for s in steps) and time.monotonic() < deadline:
            self._stop.wait(self._poll_s)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        try:
            self._drain(block=True)
        except Exception as e:
            self._rec.error("cuda step timing", e)


# -- the handle ------------------------------------------------------------------------------
class HookHandle:
    """What :func:`instrument` returns: the live instrumentation of one module."""

    def __init__(self, module: Any, recorder: Recorder, *, cuda: bool, method: str) -> None:
        self.module = module
        self.recorder = recorder
        self.cuda = cuda
        self.method = method
        self.active = True
        self.steps_recorded = 0
        self._sink: Any = recorder.sink("steps")
        self._counter = 0  # tokens fed since the sequence began (last-resort kv_len)
        self._fresh = True
        self._local = threading.local()
        self._last: Step | None = None
        self._undo: list[Callable[[], None]] = []
        self._timer: Any = None
        if cuda:
            self._timer = CudaStepTimer(self._write_step, recorder)
        recorder.on_close(self.close)

    # -- public ---------------------------------------------------------------------------
    @property
    def last(self) -> Step | None:
        """The most recent step of this module (any thread)."""
        return self._last

    def new_sequence(self) -> None:
        """Say that the next call starts a new sequence (resets the last-resort kv counter)."""
        self._fresh = True
        self._counter = 0

    @contextmanager
    def capture(self) -> Iterator[list[Step]]:
        """Collect the steps run by this thread/task inside the block (the HF wrapper uses it)."""
        steps: list[Step] = []
        token = _capture.set(steps)
        try:
            yield steps
        finally:
            _capture.reset(token)

    def resolve(self, steps: list[Step], timeout_s: float = 5.0) -> None:
        """Fill ``start_ns``/``end_ns`` of CUDA-timed steps (waits for their events: call it off the hot path)."""
        if self._timer is not None:
            self._timer.resolve(steps, timeout_s)

    def token(self, request: RequestHandle, index: int, kv_len: int | None = None, emit_ns: int = 0,
              step: Step | None = None) -> None:
        """Record token ``index`` of ``request`` tied to ``step`` (default: this module's last step).

        ``kv_len`` defaults to the step's kv_len (right for batch 1). On CUDA a step
        not yet resolved gives null step times; the ``step_id`` still ties the row.
        """
        s = step or self._last
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
        for undo in reversed(self._undo):
            self.recorder.guard(undo, where="uninstrument")
        self._undo.clear()
        try:
            if self.module.__dict__.get(_ATTR) is self:
                del self.module.__dict__[_ATTR]
        except Exception as e:
            self.recorder.error("uninstrument", e)

    def close(self) -> None:
        """Resolve and write what is pending (called when the recorder closes)."""
        if self._timer is not None:
            self._timer.close()

    # -- hot path -------------------------------------------------------------------------------
    def _pre(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int, int, int, bool, Any]:
        start = now_ns()
        shape = input_shape(args, kwargs)
        batch, q = shape if shape is not None else (1, 1)
        past = past_len(args, kwargs, q, batch)
        if past is None:  # only the device knows: count the tokens fed since the sequence began
            past = 0 if (self._fresh or q > 1) else self._counter
        self._fresh = False
        kv = past + q
        self._counter = kv
        ev = self._timer.start() if self._timer is not None else None
        return start, batch, q, kv, q > 1 or past == 0, ev

    def _post(self, pre: tuple[int, int, int, int, bool, Any]) -> None:
        end = now_ns()
        start, batch, q, kv, prefill, ev = pre
        step = Step(next(_STEP_IDS), start, end, batch, q, kv, prefill)
        self._last = step
        cap = _capture.get()
        if cap is not None:
            cap.append(step)
        if ev is not None:
            step.start_ns = step.end_ns = None
            self._timer.finish(step, ev)
        else:
            self._write_step(step)

    def _write_step(self, step: Step) -> None:
        s = self._sink
        if len(s.buf) >= s.max_items:
            s.dropped += 1
            return
        b = step.batch
        s.buf.frombytes(s.pack(step.step_id, step.start_ns, step.end_ns, b,
                               b * step.q_len if step.prefill else 0, 0 if step.prefill else b, b * step.kv_len))
        self.steps_recorded += 1


class _Forward:
    """The instance-level ``forward`` that times each call (picklable/deep-copyable as the original)."""

    def __init__(self, handle: HookHandle, orig: Callable[..., Any]) -> None:
        self.handle = handle
        self.orig = orig
        self.__wrapped__ = orig  # inspect.signature(model.forward) keeps working (HF checks it)
        functools.update_wrapper(self, orig, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        h = self.handle
        if not h.active or not h.recorder.enabled:
            return self.orig(*args, **kwargs)
        try:
            pre = h._pre(args, kwargs)
        except Exception as e:
            h.recorder.error("torch_hooks", e)
            return self.orig(*args, **kwargs)
        out = self.orig(*args, **kwargs)
        try:
            h._post(pre)
        except Exception as e:
            h.recorder.error("torch_hooks", e)
        return out

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        import copy

        return copy.deepcopy(self.orig, memo)  # a copied model is not instrumented

    def __reduce__(self) -> Any:
        return (getattr, (self.orig.__self__, "forward")) if hasattr(self.orig, "__self__") else (
            _identity, (self.orig,))


def _identity(x: Any) -> Any:
    return x


def _install_wrapper(h: HookHandle, module: Any) -> None:
    had_instance_forward = "forward" in module.__dict__
    orig = module.forward
    wrapper = _Forward(h, orig)
    module.__dict__["forward"] = wrapper

    def undo() -> None:
        if module.__dict__.get("forward") is wrapper:
            if had_instance_forward:
                module.__dict__["forward"] = orig
            else:
                del module.__dict__["forward"]
        # wrapped again by someone else: stays in their chain as a pass-through (h.active is False)

    h._undo.append(undo)


def _install_hooks(h: HookHandle, module: Any) -> None:
    local = h._local

    def pre_hook(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not h.active or not h.recorder.enabled:
            return
        try:
            stack = getattr(local, "stack", None)
            if stack is None:
                stack = local.stack = []
            stack.append(h._pre(args, kwargs))
        except Exception as e:
            h.recorder.error("torch_hooks", e)

    def post_hook(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        stack = getattr(local, "stack", None)
        if not stack:
            return
        try:
            h._post(stack.pop())
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


def instrument(model: Any, recorder: Recorder, *, method: str = "wrap", cuda_timing: bool | None = None) -> HookHandle:
    """Time every forward call of ``model`` as a ``steps`` row; returns the handle.

    Args:
        model: a ``torch.nn.Module`` (the top-level model whose calls are engine steps).
        recorder: a started :class:`~collectors.recorder.Recorder`.
        method: ``"wrap"`` (instance-level forward wrapper, cheapest) or ``"hooks"``
            (``register_forward_pre_hook``/``register_forward_hook``).
        cuda_timing: time with CUDA events; default: when the model's parameters are on CUDA.

    Instrumenting an instrumented model returns its existing handle.
    """
    existing = model.__dict__.get(_ATTR)
    if isinstance(existing, HookHandle) and existing.active:
        return existing
    if method not in ("wrap", "hooks"):
        raise ValueError(f"method must be 'wrap' or 'hooks', not {method!r}")
    cuda = _on_cuda(model) if cuda_timing is None else cuda_timing
    h = HookHandle(model, recorder, cuda=cuda, method=method)
    if method == "wrap":
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


__all__ = ["CudaStepTimer", "HookHandle", "Step", "cache_seq_len", "handle_of", "input_shape", "instrument",
           "past_len", "uninstrument"]
