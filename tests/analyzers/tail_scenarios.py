"""Traces with a known tail cause, for the tail tests (module tail, docs/findings.md).

Each scenario draws requests from seeded distributions in which exactly one mechanism makes the slow
ones slow (a queue behind bursts of arrivals, a few 30k-token prompts, a load client whose event
loop stalls, new connections over a long round trip, one slow replica), or none does (noise), and
writes them as a real v1 trace with plain pyarrow (analyzer_scenarios). Batched-engine causes
(prefill interference, preemption) come from the continuous-batching simulator (batch_sim). What a
test checks is the cause the scenario built in, never numbers typed in: the analyzer's figures are
compared with what the generator wrote (:class:`Written`). :data:`CASES` lists every scenario with the
finding that must name its cause, and :func:`build` writes each as the tests of every surface (analyze,
the TUI, report, diff) size it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

try:  # as tests/analyzers' sibling modules import each other, and from tests elsewhere
    from analyzer_scenarios import CLIENT_OFFSET, MS, spans, tokens, write_trace
    from batch_sim import Config
    from batch_sim import run as simulate
except ImportError:
    from tests.analyzers.analyzer_scenarios import CLIENT_OFFSET, MS, spans, tokens, write_trace
    from tests.analyzers.batch_sim import Config
    from tests.analyzers.batch_sim import run as simulate


@dataclass
class TReq:
    """One request, times in milliseconds; None = the trace does not record it."""

    intended: float                   # client clock: when the load client meant to send it
    client_queue: float | None = None  # waited in the load client before sending
    handshake: float | None = None     # a new connection: TCP (+TLS) handshake before the request
    network: float = 2.0               # round trip the request pays on the wire
    queue: float = 0.0
    tokenize: float = 0.5
    prefill: float = 30.0
    itl: float = 15.0
    output: int = 24
    prompt: int = 1000
    frontend: float = 0.0              # in the server before its engine's span (written with engine_scope)


@dataclass
class Written:
    """What was written: the requests (by id) and the trace directory."""

    path: Path
    reqs: dict[str, TReq]
    extra: dict[str, Any] = field(default_factory=dict)


def write(directory: Path, reqs: list[TReq], *, loop_lags: list[tuple[float, float]] = (),  # type: ignore[assignment]
          engine_scope: bool = False) -> Written:
    """A client + server trace of ``reqs``: client.queue (when recorded), client.connect for a new
    connection, client.request around the server's spans, one token per ``itl`` after prefill, and the
    load client's loop stalls (``loop_lags``, client clock, ms) as client.loop_lag spans. With
    ``engine_scope`` the server's spans are its engine's (server_scope 'engine', as vLLM's): each
    request's ``frontend`` time comes before server.request starts, inside client.request."""
    rows: list[tuple[str, str, int, int, str]] = []
    toks: list[dict[str, Any]] = []
    info: dict[str, list[Any]] = {"request_id": [], "prompt_tokens": [], "output_tokens": [], "status": []}
    by_id: dict[str, TReq] = {}
    for i, r in enumerate(reqs):
        rid = f"r{i:05d}"
        by_id[rid] = r
        c0 = round(r.intended * MS)
        if r.client_queue is not None:
            rows.append((rid, "client.queue", CLIENT_OFFSET + c0, CLIENT_OFFSET + c0 + round(r.client_queue * MS),
                         "client"))
        send = c0 + round((r.client_queue or 0) * MS)
        t = send
        if r.handshake is not None:
            rows.append((rid, "client.connect", CLIENT_OFFSET + t, CLIENT_OFFSET + t + round(r.handshake * MS),
                         "client"))
            t += round(r.handshake * MS)
        half = round(r.network * MS / 2)
        s0 = t + half + round(r.frontend * MS)  # the server's clock is the client's minus CLIENT_OFFSET
        s = s0
        for name, d in (("queue", r.queue), ("tokenize", r.tokenize)):
            rows.append((rid, name, s, s + round(d * MS), "server"))
            s += round(d * MS)
        first = s + round(r.prefill * MS)
        rows.append((rid, "prefill", s, first, "server"))
        emits = [first + round(k * r.itl * MS) for k in range(r.output)]
        rows.append((rid, "decode", first, emits[-1], "server"))
        s1 = emits[-1]
        rows.append((rid, "server.request", s0, s1, "server"))
        rows.append((rid, "client.request", CLIENT_OFFSET + send, CLIENT_OFFSET + s1 + half, "client"))
        for k, e in enumerate(emits):
            toks.append({"request_id": rid, "index": k, "emit_ns": e, "client_recv_ns": CLIENT_OFFSET + e + half})
        for col, v in (("request_id", rid), ("prompt_tokens", r.prompt), ("output_tokens", r.output), ("status", "ok")):
            info[col].append(v)
    for a, b in loop_lags:
        rows.append(("", "client.loop_lag", CLIENT_OFFSET + round(a * MS), CLIENT_OFFSET + round(b * MS), "client"))
    tables = {"spans": spans(rows), "tokens": tokens(toks),
              "requests": pa.table({"request_id": pa.array(info["request_id"], pa.string()),
                                    "prompt_tokens": pa.array(info["prompt_tokens"], pa.int32()),
                                    "output_tokens": pa.array(info["output_tokens"], pa.int32()),
                                    "status": pa.array(info["status"], pa.string())})}
    if engine_scope:
        tables["requests"] = tables["requests"].append_column(
            "server_scope", pa.array(["engine"] * len(reqs), pa.string()))
    return Written(write_trace(directory, tables, {"closed": True}), by_id)


def _arrivals(rng: random.Random, n: int, rate_per_s: float, burstiness: float = 1.0) -> list[float]:
    """Arrival times (ms) of a gamma process: shape ``burstiness`` (1: Poisson; below 1: burstier), mean
    rate ``rate_per_s`` (as tracetool probe --rate/--burstiness draws them)."""
    t, out = 0.0, []
    for _ in range(n):
        t += rng.gammavariate(burstiness, 1.0 / (rate_per_s * burstiness)) * 1000
        out.append(t)
    return out


def _jitter(rng: random.Random, x: float, sigma: float = 0.1) -> float:
    return x * rng.lognormvariate(0, sigma)


def queue_bursts(directory: Path, n: int = 1000, seed: int = 0, burstiness: float = 1.0) -> Written:
    """An engine with 4 slots at ~80 % utilisation under Poisson (or burstier) arrivals: a request that
    finds every slot busy waits in the queue (FIFO) for the first to free."""
    rng = random.Random(seed)
    slots = [0.0] * 4
    reqs = []
    for t in _arrivals(rng, n, rate_per_s=8.0, burstiness=burstiness):
        prompt = rng.randint(500, 1500)
        prefill, itl, output = _jitter(rng, prompt * 0.03), _jitter(rng, 15.0), 24
        arrive = t + 1.0  # half the round trip
        k = min(range(len(slots)), key=lambda i: slots[i])
        start = max(arrive, slots[k])
        service = 0.5 + prefill + itl * (output - 1)
        slots[k] = start + service
        reqs.append(TReq(intended=t, network=2.0, queue=start - arrive, prefill=prefill, itl=itl, output=output,
                         prompt=prompt))
    return write(directory, reqs)


def frontend_bursts(directory: Path, n: int = 1000, seed: int = 6) -> Written:
    """An API server in front of an engine with room for every request (no engine queue), its spans the
    engine's (as vLLM's): the API server's one event loop spends ~100 ms on each request before the engine
    (FIFO, ~80 % busy under Poisson arrivals), so requests that arrive into a burst wait there, outside
    the engine's span. The first request opens the connection (its handshake times the round trip)."""
    rng = random.Random(seed)
    free, reqs = 0.0, []
    for i, t in enumerate(_arrivals(rng, n, rate_per_s=8.0)):
        prompt = rng.randint(500, 1500)
        arrive = t + 1.0
        start = max(arrive, free)
        free = start + _jitter(rng, 100.0)
        reqs.append(TReq(intended=t, network=2.0, handshake=2.0 if i == 0 else None, frontend=free - arrive,
                         prefill=_jitter(rng, prompt * 0.03), itl=_jitter(rng, 15.0), prompt=prompt))
    return write(directory, reqs, engine_scope=True)


def long_prompts(directory: Path, n: int = 1000, seed: int = 1, share: float = 0.02,
                 prefill_per_token: float = 0.03) -> Written:
    """A lightly loaded server (no queue): prompts of 200-1,500 tokens and a few (``share``) of 30,000;
    prefill takes ``prefill_per_token`` ms per prompt token."""
    rng = random.Random(seed)
    reqs = []
    for t in _arrivals(rng, n, rate_per_s=4.0):
        prompt = 30_000 if rng.random() < share else rng.randint(200, 1500)
        reqs.append(TReq(intended=t, network=_jitter(rng, 2.0), tokenize=prompt * 0.001,
                         prefill=_jitter(rng, prompt * prefill_per_token), itl=_jitter(rng, 15.0), prompt=prompt))
    return write(directory, reqs)


def client_stalls(directory: Path, n: int = 1000, seed: int = 2) -> Written:
    """A scheduled load run (client.queue spans) whose load client's event loop stalls 400 ms every
    ~10 s: requests meant to go out during a stall wait for it to end, in the client."""
    rng = random.Random(seed)
    arrivals = _arrivals(rng, n, rate_per_s=4.0)
    lags, t = [], 3000.0
    while t < arrivals[-1]:
        lags.append((t, t + 400.0))
        t += rng.uniform(8000, 12000)
    reqs = []
    for a in arrivals:
        wait = next((b - a for s, b in lags if s <= a < b), 0.0) + _jitter(rng, 0.2)
        reqs.append(TReq(intended=a, client_queue=wait, network=_jitter(rng, 2.0), prefill=_jitter(rng, 30.0),
                         itl=_jitter(rng, 15.0), prompt=rng.randint(500, 1500)))
    return write(directory, reqs, loop_lags=lags)


def new_connections(directory: Path, n: int = 1000, seed: int = 3, share: float = 0.05) -> Written:
    """A client far from the server (80 ms round trip) that keeps connections alive but opens a new one
    for ``share`` of its requests: TCP and TLS handshakes, two more round trips."""
    rng = random.Random(seed)
    reqs = []
    for t in _arrivals(rng, n, rate_per_s=4.0):
        new = rng.random() < share
        reqs.append(TReq(intended=t, handshake=_jitter(rng, 160.0, 0.05) if new else None,
                         network=_jitter(rng, 80.0, 0.05), prefill=_jitter(rng, 30.0), itl=_jitter(rng, 15.0),
                         prompt=rng.randint(500, 1500)))
    return write(directory, reqs)


def noise(directory: Path, n: int = 1000, seed: int = 4) -> Written:
    """Identical requests at low load whose phases jitter independently (log-normal): a tail exists, and
    nothing the trace holds about its requests explains it."""
    rng = random.Random(seed)
    reqs = []
    for t in _arrivals(rng, n, rate_per_s=2.0):
        reqs.append(TReq(intended=t, network=_jitter(rng, 2.0, 0.3), queue=_jitter(rng, 1.0, 0.3),
                         prefill=_jitter(rng, 30.0, 0.3), itl=_jitter(rng, 15.0, 0.2),
                         prompt=rng.randint(900, 1100)))
    return write(directory, reqs)


def slow_replica(root: Path, n: int = 1000, seed: int = 5, slow: str = "c") -> dict[str, Written]:
    """A dataset of four replicas behind a round-robin balancer (root/server=a ... server=d), each a
    trace; replica ``slow`` runs its prefill and decode 2.5x slower (a throttled or shared GPU)."""
    rng = random.Random(seed)
    arrivals = _arrivals(rng, n, rate_per_s=8.0)
    out = {}
    for k, name in enumerate("abcd"):
        f = 2.5 if name == slow else 1.0
        reqs = [TReq(intended=a, network=_jitter(rng, 2.0), prefill=_jitter(rng, 30.0) * f, itl=_jitter(rng, 15.0) * f,
                     prompt=rng.randint(500, 1500)) for a in arrivals[k::4]]
        out[name] = write(root / f"server={name}", reqs)
    return out


#: The batched engine's scenarios (batch_sim): whole prompts prefilled in steps of their own between
#: the decodes (interference; interference_short: its prompts a quarter as long, a milder case for the
#: diff), and a KV cache too small for the sequences admitted (preemption).
BATCHED = {"interference": Config(requests=200, rate_per_s=12, output=(100, 200)),
           "interference_short": Config(requests=200, rate_per_s=12, output=(100, 200), prompt=(250, 500)),
           "preempt": Config(requests=200, rate_per_s=30, kv_capacity=40_000, output=(200, 400))}


@dataclass(frozen=True)
class Case:
    """One scenario as every surface of the tail (analyze, the TUI, report, diff) is tested on it."""

    name: str
    #: the tail finding that names the cause built in; tail-noise: none is built in
    finding: str
    #: where the extra time of the tail the finding is about is: the component of that metric (ITL: the
    #: decode part) with the largest share of its gap; None for noise
    component: str | None
    #: the other tail findings the scenario justifies; any other named is a wrong cause
    also: frozenset[str] = frozenset()


#: The batched runs arrive faster than the engine serves them: its queue grows through the run, and the
#: TTFT tail is the last arrivals, queueing. The preempting engine also prefills in steps of its own (new
#: prompts, and each preempted sequence's recomputation): ITL spikes behind prefill.
_OVERLOADED = frozenset({"tail-queue-bursts"})

CASES = (Case("queue_bursts", "tail-queue-bursts", "queue"),
         Case("long_prompts", "tail-long-prompts", "prefill"),
         Case("client_stalls", "tail-client-delay", "client_queue"),
         Case("new_connections", "tail-new-connections", "network"),
         Case("slow_replica", "tail-slow-replica", "prefill"),
         Case("interference", "tail-prefill-interference", "prefill", _OVERLOADED),
         Case("preempt", "tail-preemption", "no_step", _OVERLOADED | {"tail-prefill-interference"}),
         Case("noise", "tail-noise", None))


def build(root: Path, name: str) -> Path:
    """Scenario ``name`` of :data:`CASES` written under ``root/name``, as the tail tests size it: its trace
    directory, or for slow_replica the dataset of its four replicas."""
    if name in BATCHED:
        return simulate(root / name, BATCHED[name]).path
    if name == "slow_replica":
        slow_replica(root / name, n=800)
        return root / name
    make = {"queue_bursts": queue_bursts, "long_prompts": long_prompts, "client_stalls": client_stalls,
            "new_connections": new_connections, "noise": noise}[name]
    return make(root / name).path


__all__ = ["BATCHED", "CASES", "Case", "TReq", "Written", "build", "client_stalls", "frontend_bursts", "long_prompts",
           "new_connections", "noise", "queue_bursts", "slow_replica", "write"]
