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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from collectors.recorder import NULL, Recorder, RequestHandle, now_ns
from collectors.torch_hooks.kv import cache_seq_len, input_shape, past_len

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
            from collectors.torch_hooks.cuda import CudaStepTimer

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


__all__ = ["HookHandle", "Step", "cache_seq_len", "handle_of", "input_shape", "instrument", "past_len",
           "uninstrument"]
