"""Synthetic, realistic CI runs: one workload, many noisy runs of it.

A *workload* fixes what a CI job sends: a handful of requests with their
prompt and output lengths. A *run* of it draws the timings from a seeded noise
model shaped like a real decode-dominant chat server (docs/domain.md §1):

* per run: a lognormal factor (σ 1 %) on every GPU-bound time — machine to
  machine and hour to hour drift that no resampling inside one run can see;
* per request: lognormal jitter on prefill (σ 3 %) and on the request's decode
  speed (σ 3 %), network RTT ~2 ms (σ 20 %), queueing ~0.5 ms (σ 50 %),
  tokenize ~0.8 µs per prompt token;
* per token: ITL = (12 ms + 0.4 ms per 1k KV) x request factor x lognormal(σ 5 %),
  and 1 % of tokens stall 2.5x (a scheduling hiccup).

Python's ``random.Random`` drives it (its stream is stable across versions), so
golden files built from these traces do not move when numpy changes.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from tracetool.report.stats import Sample

MS = 1_000_000
GOLDEN = Path(__file__).parent / "golden"
VLLM_FIXTURE = Path(__file__).resolve().parents[1] / "importers" / "fixtures" / "vllm_bench_serve.json"
CLIENT_OFFSET = 7_000_000_000_000  # client clock unrelated to the server's


@dataclass(frozen=True)
class Workload:
    """What a CI job sends: prompt and output lengths per request."""

    prompts: tuple[int, ...]
    outputs: tuple[int, ...]

    @classmethod
    def make(cls, seed: int = 7, requests: int = 8) -> Workload:
        rng = random.Random(f"workload-{seed}")
        prompts = tuple(int(min(4000, max(200, rng.lognormvariate(7.0, 0.5)))) for _ in range(requests))
        outputs = tuple(rng.randint(64, 200) for _ in range(requests))
        return cls(prompts, outputs)


@dataclass
class Req:
    rid: str
    prompt: int
    client_start: int
    client_end: int
    server_start: int
    server_end: int
    phases: list[tuple[str, int, int]]
    emits: list[int]
    recvs: list[int]


@dataclass
class SynthRun:
    requests: list[Req] = field(default_factory=list)

    def samples(self) -> dict[str, Sample]:
        """The samples the report should extract (client-side TTFT/ITL, as the analyzers define them)."""
        ttft, tpot, e2e, itl, keys = [], [], [], [], []
        for r in self.requests:
            e = (r.client_end - r.client_start) / 1e6
            t = (r.recvs[0] - r.client_start) / 1e6
            e2e.append(e)
            ttft.append(t)
            tpot.append((e - t) / (len(r.recvs) - 1))
            gaps = np.diff(np.asarray(r.recvs, dtype=np.int64)) / 1e6
            itl.extend(gaps.tolist())
            keys.extend([r.rid] * len(gaps))
        return {"ttft": Sample.of(ttft), "itl": Sample.of(itl, keys), "tpot": Sample.of(tpot),
                "e2e": Sample.of(e2e)}

    def write(self, directory: Path) -> Path:
        """A v1 trace (client and server side, as tracetool probe + merge would give)."""
        directory.mkdir(parents=True, exist_ok=True)
        sp: dict[str, list] = {"request_id": [], "name": [], "start_ns": [], "end_ns": [], "clock": []}
        tk: dict[str, list] = {"request_id": [], "index": [], "emit_ns": [], "kv_len": [], "client_recv_ns": []}
        rq: dict[str, list] = {"request_id": [], "prompt_tokens": [], "output_tokens": [], "status": []}

        def span(rid: str, name: str, s: int, e: int, clock: str) -> None:
            for k, v in zip(sp, (rid, name, s, e, clock), strict=True):
                sp[k].append(v)

        for r in self.requests:
            span(r.rid, "client.request", r.client_start, r.client_end, "client")
            span(r.rid, "server.request", r.server_start, r.server_end, "server")
            for name, s, e in r.phases:
                span(r.rid, name, s, e, "server")
            for i, (em, rc) in enumerate(zip(r.emits, r.recvs, strict=True)):
                for k, v in zip(tk, (r.rid, i, em, r.prompt + i, rc), strict=True):
                    tk[k].append(v)
            for k, v in zip(rq, (r.rid, r.prompt, len(r.emits), "ok"), strict=True):
                rq[k].append(v)
        tables = {
            "spans": pa.table({"request_id": pa.array(sp["request_id"], pa.string()),
                               "name": pa.array(sp["name"], pa.string()),
                               "start_ns": pa.array(sp["start_ns"], pa.int64()),
                               "end_ns": pa.array(sp["end_ns"], pa.int64()),
                               "clock": pa.array(sp["clock"], pa.string())}),
            "tokens": pa.table({"request_id": pa.array(tk["request_id"], pa.string()),
                                "index": pa.array(tk["index"], pa.int32()),
                                "emit_ns": pa.array(tk["emit_ns"], pa.int64()),
                                "kv_len": pa.array(tk["kv_len"], pa.int32()),
                                "client_recv_ns": pa.array(tk["client_recv_ns"], pa.int64())}),
            "requests": pa.table({"request_id": pa.array(rq["request_id"], pa.string()),
                                  "prompt_tokens": pa.array(rq["prompt_tokens"], pa.int32()),
                                  "output_tokens": pa.array(rq["output_tokens"], pa.int32()),
                                  "status": pa.array(rq["status"], pa.string())}),
        }
        for name, table in tables.items():
            with pa.OSFile(str(directory / f"{name}.arrows"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
                w.write_table(table)
        (directory / "meta.json").write_text(json.dumps({"format": "tracetool", "version": 1, "closed": True}))
        return directory


def run(workload: Workload, seed: int, *, itl_factor: float = 1.0, ttft_factor: float = 1.0,
        run_sigma: float = 0.01) -> SynthRun:
    """One noisy run of ``workload``; ``itl_factor`` > 1 injects a decode regression."""
    rng = random.Random(f"run-{seed}")
    machine = rng.lognormvariate(0.0, run_sigma)
    out = SynthRun()
    for i, (prompt, output) in enumerate(zip(workload.prompts, workload.outputs, strict=True)):
        rid = f"req-{i:02d}"
        s0 = 1_000 * MS + i * 50 * MS
        t = s0
        phases = []
        for name, ms in (("tokenize", prompt * 0.0008 * rng.lognormvariate(0, 0.1)),
                         ("queue", 0.5 * rng.lognormvariate(0, 0.5)),
                         ("prefill", (5 + prompt * 0.03) * rng.lognormvariate(0, 0.03) * machine * ttft_factor)):
            d = round(ms * MS)
            phases.append((name, t, t + d))
            t += d
        speed = rng.lognormvariate(0, 0.03) * machine * itl_factor
        emits = [t]
        for k in range(1, output):
            itl = (12 + 0.4 * (prompt + k) / 1000) * speed * rng.lognormvariate(0, 0.05)
            if rng.random() < 0.01:
                itl *= 2.5
            emits.append(emits[-1] + round(itl * MS))
        phases.append(("decode", emits[0], emits[-1]))
        detok = round(0.3 * MS)
        phases.append(("detokenize", emits[-1], emits[-1] + detok))
        s1 = emits[-1] + detok
        half = round(2.0 * rng.lognormvariate(0, 0.2) * MS / 2)
        recvs = [CLIENT_OFFSET + e + half + round(rng.random() * 0.05 * MS) for e in emits]
        for k in range(1, len(recvs)):  # delivery jitter never reorders chunks
            recvs[k] = max(recvs[k], recvs[k - 1])
        out.requests.append(Req(rid=rid, prompt=prompt, client_start=CLIENT_OFFSET + s0 - half,
                                client_end=max(CLIENT_OFFSET + s1 + half, recvs[-1]), server_start=s0,
                                server_end=s1, phases=phases, emits=emits, recvs=recvs))
    return out
