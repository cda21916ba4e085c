"""When ``tracetool probe`` means to send each request, and how well its own event loop keeps up.

A load generator that starts a request's clock when it gets a concurrency slot
hides its own queueing: the time a request waited in the client disappears from
its latency (vLLM fixed this in ``bench serve``, PR 54136). Here every request
of a scheduled run carries its **intended send time**, the moment the schedule
said to send it; the probe measures latency from it and records the wait
before the send as a ``client.queue`` span (client clock).

* :func:`arrival_offsets`: seconds after the start at which each request is due:
  Poisson arrivals at ``rate`` (``burstiness`` 1; vLLM's gamma-distributed
  gaps otherwise, ``inf`` = evenly spaced), optionally ramping linearly from
  zero over ``ramp_s``. Without a rate there is no schedule (closed loop: a
  request is due when a slot frees, so it never waits in the client).
* :class:`LoopMonitor`: how late the probe's own event loop wakes up. A probe
  whose loop lags sends late and reads chunks late; past about a millisecond it
  measures itself as much as the server (benchmarks/bench_probe_capacity.py).
"""

from __future__ import annotations

import asyncio
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tracetool.errors import UsageError

#: Event-loop lag (ms) beyond which the probe's own timing is no longer negligible.
LAG_LIMIT_MS = 1.0
#: The probe warns when this share of its wake-ups in a window come later than LAG_LIMIT_MS.
LAG_WARN_SHARE = 0.05
#: Process CPU time per wall second at or above which the probe itself is CPU-bound.
CPU_BOUND = 0.9
#: The client-bound rule (the same defaults as analyzers/params.py, kept equal by a test): the
#: client sends below this share of the offered rate, or requests wait at least CLIENT_QUEUE_SHARE
#: of their e2e in the client.
CLIENT_RATE_RATIO = 0.9
CLIENT_QUEUE_SHARE = 0.10


def arrival_offsets(n: int | None, rate: float, *, seed: int = 0, burstiness: float = 1.0,
                    ramp_s: float = 0.0, duration_s: float | None = None) -> list[float]:
    """Offsets (s, from the run's start) of ``n`` arrivals, or of every arrival within ``duration_s``.

    Gaps are gamma-distributed with mean ``1/rate`` and shape ``burstiness`` (1 = Poisson, as
    vLLM's ``--burstiness``; ``inf`` = constant gaps). With ``ramp_s`` the rate grows linearly
    from 0 to ``rate`` over the first ``ramp_s`` seconds: the gaps are drawn in "full-rate time"
    and mapped through the inverse of the cumulative rate, so the shape of the arrivals is kept.
    """
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if n is None and duration_s is None:
        raise ValueError("a schedule needs n or a duration")
    rng = random.Random(seed)
    out: list[float] = []
    u = 0.0  # full-rate seconds: cumulative arrivals / rate. The first request is due at once.
    while n is None or len(out) < n:
        t = _ramped(u, ramp_s)
        if duration_s is not None and t >= duration_s:
            break
        out.append(t)
        u += 1.0 / rate if math.isinf(burstiness) else rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return out


def _ramped(u: float, ramp_s: float) -> float:
    """Wall offset at which ``u`` full-rate seconds of arrivals have accumulated under a linear ramp."""
    if ramp_s <= 0:
        return u
    # cumulative arrivals over a ramp: rate * t^2 / (2 ramp) for t < ramp, then rate * (t - ramp/2)
    if u < ramp_s / 2:
        return math.sqrt(2 * ramp_s * u)
    return u + ramp_s / 2


@dataclass
class LoopStats:
    """What the monitor saw: wake-ups, how many came late, the worst lag."""

    wakeups: int = 0
    late: int = 0
    max_lag_ms: float = 0.0
    lags_ms: list[float] = field(default_factory=list)
    #: (start_ns, end_ns) on the client clock of each wake-up later than LAG_LIMIT_MS
    stalls: list[tuple[int, int]] = field(default_factory=list)

    def p(self, q: float) -> float | None:
        if not self.lags_ms:
            return None
        s = sorted(self.lags_ms)
        return s[min(len(s) - 1, int(q * len(s)))]


class LoopMonitor:
    """Samples the event loop's lag: sleeps ``interval_s`` and measures how much later it woke.

    ``on_window(late_share, max_lag_ms)`` is called once per ``window_s`` (the probe's warning);
    the monitor keeps a bounded sample of lags for percentiles and every stall for the trace.
    """

    MAX_SAMPLES = 100_000
    MAX_STALLS = 10_000

    def __init__(self, clock_ns: Callable[[], int], interval_s: float = 0.005, window_s: float = 1.0,
                 on_window: Callable[[float, float], None] | None = None) -> None:
        self.clock_ns = clock_ns
        self.interval_s = interval_s
        self.window_s = window_s
        self.on_window = on_window
        self.stats = LoopStats()
        self.cpu0 = time.process_time()
        self.wall0 = time.monotonic()

    def cpu_share(self) -> float:
        """Process CPU seconds per wall second since the monitor was made (1.0 = one core busy)."""
        wall = time.monotonic() - self.wall0
        return (time.process_time() - self.cpu0) / wall if wall > 0 else 0.0

    async def run(self) -> None:
        st = self.stats
        win_n = win_late = 0
        win_max = 0.0
        win_end = time.monotonic() + self.window_s
        while True:
            due = self.clock_ns() + int(self.interval_s * 1e9)
            await asyncio.sleep(self.interval_s)
            now = self.clock_ns()
            lag = max(0, now - due) / 1e6
            st.wakeups += 1
            win_n += 1
            if len(st.lags_ms) < self.MAX_SAMPLES:
                st.lags_ms.append(lag)
            st.max_lag_ms = max(st.max_lag_ms, lag)
            win_max = max(win_max, lag)
            if lag > LAG_LIMIT_MS:
                st.late += 1
                win_late += 1
                if len(st.stalls) < self.MAX_STALLS:
                    st.stalls.append((due, now))
            if time.monotonic() >= win_end:
                if self.on_window is not None:
                    self.on_window(win_late / win_n, win_max)
                win_n = win_late = 0
                win_max = 0.0
                win_end = time.monotonic() + self.window_s


async def progress_loop(show: Callable[[], None]) -> None:
    """Call ``show`` every 0.25 s on a terminal, every 2 s otherwise, until cancelled."""
    every = 0.25 if sys.stderr.isatty() else 2.0
    while True:
        await asyncio.sleep(every)
        show()


def print_progress(line: str, final: bool = False) -> None:
    """One progress line on stderr: rewritten in place on a terminal, appended otherwise."""
    try:
        if sys.stderr.isatty():
            sys.stderr.write("\r\x1b[K" + line + ("\n" if final else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def check_config(cfg: Any) -> None:
    """The probe's options that cannot go together or are out of range: a usage error (exit 2)."""
    if (cfg.n is not None and cfg.n < 1) or cfg.concurrency < 1 or cfg.max_tokens < 1 or cfg.prompt_tokens < 1:
        raise UsageError("-n, --concurrency, --max-tokens and --prompt-tokens must be >= 1")
    if cfg.turns < 1 or cfg.prefix_len < 0 or not cfg.time_scale > 0:
        raise UsageError("--turns must be >= 1, --prefix-len >= 0 and --time-scale > 0")
    if sum(x is not None for x in (cfg.dataset, cfg.replay, cfg.prompt_file)) > 1:
        raise UsageError("pick one of --dataset, --replay and --prompt-file")
    if cfg.replay is not None and cfg.rate is not None:
        raise UsageError("--replay keeps the file's timestamps; --rate does not apply")
    if cfg.ramp_s and cfg.rate is None:
        raise UsageError("--ramp ramps the --rate schedule; pass --rate")
    if (cfg.duration_s is not None and cfg.duration_s <= 0) or cfg.warmup_s < 0 or cfg.ramp_s < 0:
        raise UsageError("--duration must be > 0, --warmup and --ramp >= 0")
    if cfg.turns > 1 and cfg.chat is False:
        raise UsageError("--turns needs the chat endpoint (conversations carry messages)")
    if cfg.rate is not None and cfg.rate <= 0:
        raise UsageError("--rate must be > 0 requests/s")
    if not cfg.burstiness > 0:
        raise UsageError("--burstiness must be > 0")
