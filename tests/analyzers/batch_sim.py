"""A small continuous-batching engine simulator that writes real v1 traces with tracetool's writer.

Requests arrive as a Poisson process; a scheduler admits them into a batch of at most
``max_batch`` sequences while their KV cache fits; each iteration (one ``steps`` row)
either prefills (whole prompts in a prefill-only step, or chunks of them beside the
running decodes) or decodes every running sequence. Step time follows the memory
roofline of a GPU at a fixed physical efficiency: (weights read + the batch's KV
bytes) / (bandwidth x efficiency), plus prefill compute. MoE models read the dense
weights plus the experts the batch's sequences actually routed to (drawn per step,
top-k of E each), not a formula. Speculative decoding accepts 1..k+1 tokens per
request-step, emitted at one moment. When the KV cache would overflow, the most
recently admitted sequence is preempted and later recomputed.

What the tests compare against is computed from what this writes (the returned
:class:`Sim` keeps the same rows), never typed in. This is a test double: it lives
in tests/ and is never presented as a real engine.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from tracetool.writer import TraceWriter

MS = 1_000_000
H100 = {"gpu": "H100 SXM", "gpu_count": 1, "mem_bw_bytes_per_s": 3.35e12, "peak_flops": 9.89e14}
LLAMA_8B = {"name": "Llama 3.1 8B", "params": 8.03e9, "layers": 32, "kv_heads": 8, "head_dim": 128,
            "hidden": 4096, "vocab": 128256, "weight_bytes_per_param": 2, "kv_bytes_per_elem": 2}
MIXTRAL = {"name": "Mixtral 8x7B", "params": 46.7e9, "active_params": 12.9e9, "experts": 8, "experts_per_token": 2,
           "layers": 32, "kv_heads": 8, "head_dim": 128, "hidden": 4096, "vocab": 32000,
           "weight_bytes_per_param": 2, "kv_bytes_per_elem": 2}


@dataclass
class Config:
    requests: int = 120
    rate_per_s: float = 20.0          # Poisson arrivals; 0: every request arrives at time 0
    prompt: tuple[int, int] = (1000, 2000)   # uniform range, tokens
    output: tuple[int, int] = (100, 200)
    max_batch: int = 32
    kv_capacity: int = 10**9          # KV-cache tokens the engine may hold
    chunk: int | None = None          # chunked prefill budget per step (tokens); None: prefill-only steps
    spec_k: int = 0                   # speculative tokens per step (0: off)
    accept: float = 0.7               # probability each speculative token is accepted
    efficiency: float = 0.70          # physical bandwidth efficiency of decode
    prefill_efficiency: float = 0.5   # of peak FLOP/s
    gap_ms: float = 0.9               # engine gap between iterations (host, scheduler)
    emit_ms: float = 0.05             # from a step's end to its tokens' emit
    noise: float = 0.01               # relative jitter of step times
    failed: int = 0                   # extra requests that fail after fail_ms, no tokens
    fail_ms: float = 10_000.0
    model: dict[str, Any] = field(default_factory=lambda: dict(LLAMA_8B))
    hardware: dict[str, Any] = field(default_factory=lambda: dict(H100))
    seed: int = 0


@dataclass(eq=False)  # identity: two requests are never the same one
class _Req:
    rid: str
    arrive_ns: int
    prompt: int
    output: int
    generated: int = 0
    prefilled: int = 0                # tokens of (prompt + generated) in the KV cache
    admit_ns: int | None = None
    first_ns: int | None = None
    last_ns: int | None = None
    preemptions: int = 0

    def context(self) -> int:
        return self.prompt + self.generated


@dataclass
class Sim:
    """What was written: rows of each table (as dicts of columns) and the scheduler's own record."""

    path: Path
    config: Config
    steps: dict[str, list[Any]]
    tokens: dict[str, list[Any]]
    preempted: set[str]
    touched_fraction: list[float]     # MoE: share of experts a decode step read (per step with decodes)


def _weights(model: dict[str, Any]) -> tuple[float, float, int, int]:
    """(dense bytes read by any step, bytes of all routed experts, E, k); the input embedding is one row."""
    b = model["weight_bytes_per_param"]
    active = model.get("active_params", model["params"]) - model["vocab"] * model["hidden"]
    e, k = int(model.get("experts", 1)), int(model.get("experts_per_token", 1))
    if e <= 1:
        return active * b, 0.0, 1, 1
    experts = (model["params"] - model["active_params"]) / (e - k) * e * b
    return active * b - experts * k / e, experts, e, k


def run(path: Path, cfg: Config) -> Sim:
    rng = random.Random(cfg.seed)
    m, hw = cfg.model, cfg.hardware
    dense, experts_b, n_exp, top_k = _weights(m)
    kvb = 2 * m["layers"] * m["kv_heads"] * m["head_dim"] * m["kv_bytes_per_elem"]
    bw, flops = hw["mem_bw_bytes_per_s"] * hw["gpu_count"], hw["peak_flops"] * hw["gpu_count"]
    active = m.get("active_params", m["params"])

    t, reqs = 0.0, []
    for i in range(cfg.requests):
        t += rng.expovariate(cfg.rate_per_s) if cfg.rate_per_s > 0 else 0.0
        reqs.append(_Req(f"r{i:04d}", int(t * 1e9) + 1 * MS, rng.randint(*cfg.prompt), rng.randint(*cfg.output)))
    pending = deque(reqs)
    waiting: deque[_Req] = deque()
    running: list[_Req] = []   # admission order: the last one is preempted first
    steps: dict[str, list[Any]] = {k: [] for k in ("step_id", "start_ns", "end_ns", "batch_size", "prefill_tokens",
                                                   "decode_tokens", "kv_tokens")}
    toks: dict[str, list[Any]] = {k: [] for k in ("request_id", "index", "emit_ns", "kv_len", "step_start_ns",
                                                  "step_end_ns", "batch_size", "step_id")}
    preempted: set[str] = set()
    touched: list[float] = []
    now, sid = 0, 0
    while pending or waiting or running:
        while pending and pending[0].arrive_ns <= now:
            waiting.append(pending.popleft())
        if not waiting and not running:
            now = pending[0].arrive_ns
            continue
        # admit while a slot and the KV cache allow (a preempted request goes first: it is at the front)
        while waiting and len(running) < cfg.max_batch and \
                sum(r.context() for r in running) + waiting[0].context() <= cfg.kv_capacity:
            r = waiting.popleft()
            r.admit_ns = r.admit_ns if r.admit_ns is not None else now
            r.prefilled = 0
            running.append(r)
        # preempt (recompute) until the running decodes' next tokens fit
        while len(running) > 1 and sum(r.context() + 1 + cfg.spec_k for r in running) > cfg.kv_capacity:
            r = running.pop()
            r.prefilled, r.preemptions = 0, r.preemptions + 1
            preempted.add(r.rid)
            waiting.appendleft(r)
        need = [r for r in running if r.prefilled < r.context()]
        decoding = [r for r in running if r.prefilled >= r.context()]
        chunks: dict[str, int] = {}
        if need and cfg.chunk is None:       # a prefill-only iteration: every decode waits
            decoding = []
            for r in need:
                chunks[r.rid] = r.context() - r.prefilled
        elif need:                           # chunked prefill beside the running decodes
            budget = max(cfg.chunk - len(decoding), 0)
            for r in need:
                if budget <= 0:
                    break
                chunks[r.rid] = min(budget, r.context() - r.prefilled)
                budget -= chunks[r.rid]
        batch = decoding + [r for r in need if r.rid in chunks]
        if not batch:                        # nothing fits this step: wait for the next arrival
            now = pending[0].arrive_ns if pending else now + MS
            continue
        kv_tokens = sum(r.context() for r in decoding) + sum(r.prefilled + chunks[r.rid] for r in need
                                                             if r.rid in chunks)
        w = dense
        if experts_b and decoding:
            chosen: set[int] = set()
            for _ in range(len(decoding)):
                chosen.update(rng.sample(range(n_exp), top_k))
            touched.append(len(chosen) / n_exp)
            w += experts_b * len(chosen) / n_exp
        elif experts_b:
            w += experts_b                   # a prefill's many tokens route to every expert
        mem_s = (w + sum(r.context() for r in decoding) * kvb) / bw / cfg.efficiency
        pre = sum(chunks.values())
        dur_s = (mem_s + pre * 2 * active / (flops * cfg.prefill_efficiency)) * (1 + rng.gauss(0, cfg.noise))
        start, end = now, now + int(dur_s * 1e9)
        emit = end + int(cfg.emit_ms * MS)
        for k, v in (("step_id", sid), ("start_ns", start), ("end_ns", end), ("batch_size", len(batch)),
                     ("prefill_tokens", pre), ("decode_tokens", len(decoding)), ("kv_tokens", kv_tokens)):
            steps[k].append(v)
        finished: list[_Req] = []
        for r in batch:
            if r in decoding:
                n = 1
                while n < 1 + cfg.spec_k and rng.random() < cfg.accept:
                    n += 1
            else:
                r.prefilled += chunks[r.rid]
                if r.prefilled < r.context():
                    continue
                n = 1                        # the pass that completes the prompt gives the next token
            n = min(n, r.output - r.generated)
            for j in range(n):
                for k, v in (("request_id", r.rid), ("index", r.generated + j), ("emit_ns", emit),
                             ("kv_len", r.context() + j), ("step_start_ns", start), ("step_end_ns", end),
                             ("batch_size", len(batch)), ("step_id", sid)):
                    toks[k].append(v)
            r.generated += n
            r.prefilled = r.context()
            r.first_ns = emit if r.first_ns is None else r.first_ns
            r.last_ns = emit
            if r.generated >= r.output:
                finished.append(r)
        running = [r for r in running if r not in finished]
        sid += 1
        now = end + int(cfg.gap_ms * MS * (0.5 + rng.random()))
    _write(path, cfg, reqs, steps, toks)
    return Sim(path, cfg, steps, toks, preempted, touched)


def _write(path: Path, cfg: Config, reqs: list[_Req], steps: dict[str, list[Any]],
           toks: dict[str, list[Any]]) -> None:
    meta = {"model": cfg.model, "hardware": cfg.hardware}
    with TraceWriter(path, meta=meta, declare=("spans", "tokens", "steps", "requests")) as w:
        spans, requests = w.sink("spans"), w.sink("requests")
        for r in reqs:
            assert r.admit_ns is not None and r.first_ns is not None and r.last_ns is not None
            end = r.last_ns + MS // 10
            for name, a, b in (("server.request", r.arrive_ns, end), ("queue", r.arrive_ns, r.admit_ns),
                               ("prefill", r.admit_ns, r.first_ns), ("decode", r.first_ns, r.last_ns)):
                spans.append([r.rid, name, a, b, "server"])
            requests.append([r.rid, r.prompt, r.generated, "ok", None, None])
        for i in range(cfg.failed):   # timed out: a long server.request, an error, no tokens
            rid, a = f"fail{i:03d}", reqs[(i * 7) % len(reqs)].arrive_ns
            spans.append([rid, "server.request", a, a + int(cfg.fail_ms * MS), "server"])
            requests.append([rid, 1000, 0, "error", "timeout", None])
        w.sink("steps").append_batch(steps)
        w.sink("tokens").append_batch(toks)


def split(sim: Sim) -> dict[str, float]:
    """Ground truth of the decode-time split, computed from the written rows by interval overlap
    (independent of the analyzer's running sums): per emission of each request, the time since its
    previous emission = own step + other iterations it overlapped (prefill-carrying or not) + no iteration.
    A wait in which the engine ran ``min_steps`` or more decode iterations without the request is a stall."""
    st = sim.steps
    order = sorted(range(len(st["step_id"])), key=lambda i: st["start_ns"][i])
    starts = [st["start_ns"][i] for i in order]
    by_id = {st["step_id"][i]: i for i in order}
    emissions: dict[str, dict[int, tuple[int, int]]] = {}
    tk = sim.tokens
    for rid, idx, emit, s in zip(tk["request_id"], tk["index"], tk["emit_ns"], tk["step_id"], strict=True):
        e = emissions.setdefault(rid, {})
        first, _ = e.get(s, (idx, emit))
        e[s] = (min(first, idx), emit)
    out = {"itl": 0.0, "own": 0.0, "prefill": 0.0, "other": 0.0, "gap": 0.0, "stall": 0.0, "emissions": 0,
           "tokens": 0, "stalled_requests": 0}
    for _rid, em in emissions.items():
        seq = sorted(em.items(), key=lambda kv: kv[1][0])
        stalled = False
        for (_, (_, prev_emit)), (s, (first, emit)) in pairwise(seq):
            if first == 0:
                continue
            i = by_id[s]
            own = st["end_ns"][i] - st["start_ns"][i]
            lo = bisect.bisect_left(starts, prev_emit - 10**12)  # every step that may overlap
            pre = oth = dec = 0
            for j in order[lo:bisect.bisect_left(starts, emit)]:
                if j == i:
                    continue
                ov = min(st["end_ns"][j], st["start_ns"][i]) - max(st["start_ns"][j], prev_emit)
                if ov <= 0:
                    continue
                if st["prefill_tokens"][j] > 0:
                    pre += ov
                else:
                    oth += ov
                dec += st["decode_tokens"][j] > 0
            wait = emit - prev_emit - own
            out["itl"] += emit - prev_emit
            out["own"] += own
            out["emissions"] += 1
            if dec >= 3:
                out["stall"] += wait
                stalled = True
            else:
                out["prefill"] += pre
                out["other"] += oth
                out["gap"] += wait - pre - oth
        out["stalled_requests"] += stalled
    out["tokens"] = sum(1 for i in tk["index"] if i > 0)
    return {k: (v / 1e6 if k in ("itl", "own", "prefill", "other", "gap", "stall") else v) for k, v in out.items()}


def decode_only_steps(sim: Sim) -> list[tuple[float, int, int]]:
    """(milliseconds, summed kv_tokens, batch size) of every decode-only iteration."""
    st = sim.steps
    return [((st["end_ns"][i] - st["start_ns"][i]) / 1e6, st["kv_tokens"][i], st["batch_size"][i])
            for i in range(len(st["step_id"])) if st["prefill_tokens"][i] == 0 and st["decode_tokens"][i] > 0]


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def isclose(a: float, b: float, rel: float) -> bool:
    return math.isclose(a, b, rel_tol=rel)
