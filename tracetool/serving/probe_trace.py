"""The rows ``tracetool probe`` writes for one request (see :mod:`tracetool.serving.probe`).

What is measured (client spans, receipt times, outcome) and what is placed by
estimate (the server's reported durations, centred by the symmetric-delay
assumption when the server gave its total, else anchored at the first token's
receipt) are kept apart here, in one place.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracetool.schema import PHASES_BEFORE_FIRST_TOKEN, PHASES_FROM_FIRST_TOKEN
from tracetool.serving.workloads import length_basis

if TYPE_CHECKING:
    from tracetool.serving.probe_types import RequestResult

#: Where the warm-up requests' own trace goes, inside the run's trace directory.
WARMUP_DIR = "warmup"


class ProbeTraces:
    """The run's trace (``OUT``) and, with ``--warmup``, the warm-up requests' own trace
    (``OUT/warmup``, ``meta.json`` ``probe.warmup: true``): recorded, kept out of the analysis of OUT."""

    def __init__(self, out: Path, meta: dict[str, Any], setup_connect: tuple[int, int] | None) -> None:
        from tracetool.recorder import Recorder

        self.out, self.meta = Path(out), meta
        self.main = Recorder(out, meta=meta, flush_interval_s=0.5).start()
        self.main.writer.sink("requests")  # declared: every request gets a row
        self.warm: Any = None
        if setup_connect is not None:  # an RTT sample of no request (request_id "")
            self.main.guard(self.main.add_span, "client.connect", *setup_connect, request_id="",
                            clock="client", where="probe trace")

    def record(self, r: RequestResult) -> None:
        if r.warmup and self.warm is None:
            from tracetool.recorder import Recorder

            meta = {**self.meta, "probe": {**self.meta["probe"], "warmup": True}}
            self.warm = Recorder(self.out / WARMUP_DIR, meta=meta, flush_interval_s=0.5).start()
            self.warm.writer.sink("requests")
        rec = self.warm if r.warmup else self.main
        rec.guard(write_request, rec, r, where="probe trace")

    def close(self, stalls: list[tuple[int, int]]) -> None:
        for s0, s1 in stalls:
            self.main.guard(self.main.add_span, "client.loop_lag", s0, s1, request_id="", clock="client",
                            where="probe trace")
        if self.warm is not None:
            self.warm.close()
        self.main.close()


def probe_meta(p: Any, model: str) -> dict[str, Any]:
    """``meta.json`` of a probe trace: producer, clocks, and how the run was made (``probe``)."""
    c = p.cfg
    source = "replay" if c.replay else "dataset" if c.dataset or c.prompt_file else "synthetic"
    synthetic_lengths = source in ("replay", "synthetic") or bool(c.prefix_len) or c.turns > 1
    return {
        "producer": {"name": "tracetool probe"},
        "clocks": {"client": "unix epoch nanoseconds of the probing host, advanced monotonically",
                   "server": "estimated: the client clock; server spans are the server's reported "
                             "durations placed by the symmetric-delay assumption"},
        "probe": {"url": p.base, "model": model, "endpoint": "chat" if p.chat else "completions",
                  "n": p.total, "concurrency": c.concurrency, "rate": c.rate, "burstiness": c.burstiness,
                  "max_tokens": c.max_tokens,
                  "prompt_tokens": None if c.prompt_file or c.dataset or c.replay else c.prompt_tokens,
                  "workload": {"source": source, "file": str(c.replay or c.dataset or c.prompt_file or "") or None,
                               "time_scale": c.time_scale if c.replay else None, "input_len": c.input_len,
                               "output_len": c.output_len, "prefix_len": c.prefix_len, "turns": c.turns,
                               "conversations": len(p.jobs),
                               "lengths": length_basis(p.tokenizer) if synthetic_lengths else None},
                  "duration_s": c.duration_s, "warmup_s": c.warmup_s, "ramp_s": c.ramp_s,
                  "prompt_file": str(c.prompt_file) if c.prompt_file else None, "seed": c.seed,
                  "tokenizer": str(c.tokenizer) if c.tokenizer else None,
                  "traceparent": "trace-id = request id"},  # what merge joins a server's own ids on
    }


def write_request(rec: Any, r: RequestResult) -> None:
    """The rows of one probed request (see the module docstring for what is measured vs placed)."""
    rid = r.request_id
    if r.intended_ns is not None and r.start_ns:
        # waiting in the client (for a slot, or a late loop): e2e = client.queue + client.request
        rec.add_span("client.queue", r.intended_ns, max(r.start_ns, r.intended_ns), request_id=rid, clock="client")
    if r.start_ns:
        rec.add_span("client.request", r.start_ns, max(r.end_ns, r.start_ns), request_id=rid, clock="client")
    if r.connect:
        rec.add_span("client.connect", *r.connect, request_id=rid, clock="client")
    if r.tls:
        rec.add_span("client.tls", *r.tls, request_id=rid, clock="client")
    if r.retry:
        rec.add_span("client.retry", r.retry[0], max(r.retry[1], r.retry[0]), request_id=rid, clock="client")
    one_way = 0
    st = r.server_timing or {}
    server_ns = int(st["server"] * 1e6) if "server" in st else None
    client_ns = r.end_ns - r.start_ns
    if server_ns is not None and client_ns >= server_ns >= 0:
        one_way = (client_ns - server_ns) // 2
        _place_server_spans(rec, r, server_ns, one_way)
    elif server_ns is None and r.start_ns:
        _place_phases_only(rec, r)
    prompt = prompt_tokens(r)
    for i, t in enumerate(r.token_ns):
        kv = prompt + i if prompt is not None else None
        rec.token(i, kv, t - one_way, client_recv_ns=t, request_id=rid)
    outputs = r.counted_output_tokens
    rec.request_info(rid, prompt_tokens=prompt, output_tokens=outputs,
                     status="ok" if r.ok else "error", error=r.error, prompt_chars=r.prompt_chars,
                     cached_prompt_tokens=r.cached_prompt_tokens, reasoning_tokens=reasoning_tokens(r))


def prompt_tokens(r: RequestResult) -> int | None:
    """The server's count (usage, else its timings), else --tokenizer's: what the server says wins."""
    for n in (r.prompt_tokens, r.reported_prompt_tokens, r.local_prompt_tokens):
        if n is not None:
            return n
    return None


def reasoning_tokens(r: RequestResult) -> int | None:
    """The server's reasoning count where its usage gives one, else the reasoning chunks (None without any)."""
    if r.reasoning_tokens is not None:
        return r.reasoning_tokens
    return r.reasoning_chunks or None


_BEFORE_FIRST_TOKEN = PHASES_BEFORE_FIRST_TOKEN
_AFTER_FIRST_TOKEN = PHASES_FROM_FIRST_TOKEN


def _place_server_spans(rec: Any, r: RequestResult, server_ns: int, one_way: int) -> None:
    """``server.request`` centred in ``client.request``; phases in serving order around the first
    token (prefill ends, decode starts, when it was sent), kept inside ``server.request``."""
    rid = r.request_id
    st = r.server_timing or {}
    s0 = r.start_ns + one_way
    s1 = s0 + server_ns
    rec.add_span("server.request", s0, s1, request_id=rid)
    d = {n: max(0, int(st[n] * 1e6)) for n in _BEFORE_FIRST_TOKEN + _AFTER_FIRST_TOKEN if n in st}
    before = [n for n in _BEFORE_FIRST_TOKEN if n in d]
    after = [n for n in _AFTER_FIRST_TOKEN if n in d]
    pre = sum(d[n] for n in before)
    post = sum(d[n] for n in after)
    anchor = r.token_ns[0] - one_way if r.token_ns else s0 + pre
    anchor = max(s0 + pre, min(anchor, s1 - post))
    t = anchor - pre
    for n in before:
        rec.add_span(n, t, t + d[n], request_id=rid)
        t += d[n]
    t = anchor
    for n in after:
        rec.add_span(n, t, t + d[n], request_id=rid)
        t += d[n]


def _place_phases_only(rec: Any, r: RequestResult) -> None:
    """Phases a server reported without its total (llama.cpp ``timings``, vLLM ``metrics``): no
    ``server.request``, so no one-way estimate either. Prefill (and queue before it) end, and decode
    starts, at the first token's receipt; the durations are the server's, the placement assumes
    no delay on the way back (the network is not measured for such a request)."""
    rid = r.request_id
    st = r.server_timing or {}
    d = {n: max(0, int(st[n] * 1e6)) for n in _BEFORE_FIRST_TOKEN + _AFTER_FIRST_TOKEN if n in st}
    if not d:
        return
    pre = sum(d[n] for n in _BEFORE_FIRST_TOKEN if n in d)
    anchor = max(r.token_ns[0] if r.token_ns else r.start_ns + pre, r.start_ns + pre)
    t = anchor - pre
    for n in _BEFORE_FIRST_TOKEN:
        if n in d:
            rec.add_span(n, t, t + d[n], request_id=rid)
            t += d[n]
    t = anchor
    for n in _AFTER_FIRST_TOKEN:
        if n in d:
            rec.add_span(n, t, t + d[n], request_id=rid)
            t += d[n]
