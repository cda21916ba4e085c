"""Client-side latency metrics with the definitions vLLM ``bench serve`` and AIPerf use.

Per successful streamed request, on the client's clock:

* **TTFT** = receipt of the first chunk carrying content − request start.
* **e2e** = the end of the response (the stream closed after its last event) −
  request start: the trace's ``client.request`` span, so ``analyze`` of the trace
  gives the same figure (vLLM's ``latency`` and AIPerf's ``request_latency`` stop
  at the last content chunk, a fraction of a millisecond earlier).
* **TPOT** = (e2e − TTFT) / (output_tokens − 1), for requests with more than
  one output token; ``output_tokens`` is the server's ``usage.completion_tokens``
  when it sent one, else the count its timings gave (llama.cpp), else the number
  of content chunks (the trace's ``requests.output_tokens``). AIPerf and GenAI-Perf
  call this number **inter-token latency**.
* **ITL** (vLLM's definition) = the gaps between successive content chunks,
  pooled over all requests. Chunks that arrive in one network read share a receipt
  time and count as one arrival (a zero gap is the read, not the server): the
  trace's ``tokens_gaps`` emissions, so ``analyze`` counts the same gaps. When a
  chunk holds several tokens, a chunk gap is not a token gap: compare TPOT then.

Statistics are the mean and linear-interpolated percentiles (numpy's default,
as vLLM) over successful requests only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracetool import units

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Timing:
    """What the client saw of one successful request (client-clock nanoseconds)."""

    start_ns: int
    token_ns: Sequence[int]
    last_ns: int
    output_tokens: int | None = None

    @property
    def ttft_ns(self) -> int | None:
        return self.token_ns[0] - self.start_ns if self.token_ns else None

    @property
    def e2e_ns(self) -> int:
        return self.last_ns - self.start_ns

    @property
    def tokens(self) -> int:
        return self.output_tokens if self.output_tokens is not None else len(self.token_ns)


def stats(values: Iterable[float]) -> dict[str, Any]:
    """``n``, ``mean`` and ``p50``/``p90``/``p99`` of ``values`` (None when empty)."""
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size == 0:
        return {"n": 0, "mean": None, **{f"p{p}": None for p in PERCENTILES}}
    out: dict[str, Any] = {"n": int(arr.size), "mean": float(arr.mean())}
    for p, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES), strict=True):
        out[f"p{p}"] = float(v)
    return out


def latency_metrics(timings: Sequence[Timing]) -> dict[str, dict[str, Any]]:
    """TTFT, TPOT, ITL and e2e statistics in milliseconds."""
    ttft: list[float] = []
    tpot: list[float] = []
    itl: list[float] = []
    e2e: list[float] = []
    for t in timings:
        if t.ttft_ns is None:
            continue
        ttft.append(t.ttft_ns / 1e6)
        e2e.append(t.e2e_ns / 1e6)
        if t.tokens > 1:
            tpot.append((t.e2e_ns - t.ttft_ns) / (t.tokens - 1) / 1e6)
        ts = t.token_ns
        itl.extend((ts[i] - ts[i - 1]) / 1e6 for i in range(1, len(ts)) if ts[i] > ts[i - 1])
    return {"ttft_ms": stats(ttft), "tpot_ms": stats(tpot), "itl_ms": stats(itl), "e2e_ms": stats(e2e)}


def format_table(rows: dict[str, dict[str, Any]], labels: dict[str, str]) -> list[str]:
    """Plain-text table lines: one row per metric, columns mean/p50/p90/p99 (ms)."""
    head = f"{'':<26}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'n':>7}"
    lines = [head]
    for key, label in labels.items():
        s = rows.get(key)
        if s is None:
            continue
        cells = "".join(f"{units.ms(s.get(c), unit=False):>10}" for c in ("mean", "p50", "p90", "p99"))
        lines.append(f"{label:<26}{cells}{s.get('n', 0):>7}")
    return lines
