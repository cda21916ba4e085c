"""CUDA event timing of steps, mapped onto the server clock off the hot path."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from tracetool.recorder import Recorder, now_ns

#: Raw CUDA step records are lists: [step_id, host_start_ns, host_end_ns, batch, q_len, kv_len,
#: prefill, events, start_ns, end_ns]; ``events`` is the (start, end) pair until resolved, then None.
EVENTS, START, END = 7, 8, 9


class CudaStepTimer:
    """Times steps with CUDA events and maps them onto the server clock on a resolver thread.

    The hot path only records two events on the current stream. An *anchor*
    (an event recorded on an idle side stream, waited for on the resolver
    thread) ties device time to ``time.time_ns()``; it is refreshed every
    ``reanchor_s`` so clock drift and float32 ``elapsed_time`` rounding stay
    small. ``event_factory``/``side_stream`` exist for tests without a GPU.
    """

    def __init__(self, write: Callable[[list[Any]], None], recorder: Recorder, *, reanchor_s: float = 1.0,
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
        self._pending: deque[list[Any]] = deque()
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

    def finish(self, raw: list[Any]) -> None:
        """``raw[EVENTS]`` holds the start event from :meth:`start`; record the end event and queue it."""
        ev = self._pool.pop() if self._pool else self._new_event()
        ev.record()
        raw[EVENTS] = (raw[EVENTS], ev)
        self._pending.append(raw)
        if len(self._pending) == 1:
            self._wake.set()

    # resolver side ------------------------------------------------------------------------
    def _to_ns(self, ev: Any) -> int:
        return self._anchor_ns + round(self._anchor_ev.elapsed_time(ev) * 1e6)

    def _resolve_one(self, raw: list[Any]) -> None:
        events = raw[EVENTS]
        if events is None:
            return
        s, e = events
        start = self._to_ns(s)
        raw[START], raw[END] = start, max(start, self._to_ns(e))
        raw[EVENTS] = None
        self._pool += [s, e]
        self._write(raw)

    def _drain(self, block: bool) -> None:
        with self._lock:
            while self._pending:
                raw = self._pending[0]
                events = raw[EVENTS]
                if events is not None and not events[1].query():
                    if not block:
                        return
                    events[1].synchronize()
                self._pending.popleft()
                self._resolve_one(raw)

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

    def resolve(self, steps: list[Any], timeout_s: float = 5.0) -> None:
        """Resolve raw ``steps`` now (their events are waited for on the calling thread)."""
        deadline = time.monotonic() + timeout_s
        if any(len(s) > EVENTS and s[EVENTS] is not None for s in steps):
            try:
                self._drain(block=True)
            except Exception as e:
                self._rec.error("cuda step timing", e)
        while any(len(s) > EVENTS and s[EVENTS] is not None for s in steps) and time.monotonic() < deadline:
            self._stop.wait(self._poll_s)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        try:
            self._drain(block=True)
        except Exception as e:
            self._rec.error("cuda step timing", e)
