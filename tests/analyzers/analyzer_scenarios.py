"""Trace builders for the analyzer tests: real trace directories written with plain pyarrow.

Nothing here imports tracetool: the traces are what a third party would write
from docs/trace-format.md, so the analyzers are tested against the contract.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

MS = 1_000_000
CLIENT_OFFSET = 5_000_000_000_000  # the client's clock is unrelated to the server's

LLAMA_8B_META = {"name": "Llama 3.1 8B", "params": 8.03e9, "layers": 32, "kv_heads": 8, "head_dim": 128,
                 "hidden": 4096, "vocab": 128256, "weight_bytes_per_param": 2, "kv_bytes_per_elem": 2}
H100_META = {"gpu": "H100 SXM", "gpu_count": 1, "mem_bw_bytes_per_s": 3.35e12, "peak_flops": 9.89e14}


def write_stream(path: Path, table: pa.Table) -> None:
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)


def write_trace(directory: Path, tables: Mapping[str, pa.Table], meta: Mapping[str, Any] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    body: dict[str, Any] = {"format": "tracetool", "version": 1}
    body.update(meta or {})
    (directory / "meta.json").write_text(json.dumps(body))
    for name, table in tables.items():
        write_stream(directory / f"{name}.arrows", table)
    return directory


def spans(rows: Sequence[tuple[str, str, int, int, str]]) -> pa.Table:
    cols = list(zip(*rows, strict=True)) if rows else [[], [], [], [], []]
    return pa.table({"request_id": pa.array(cols[0], pa.string()), "name": pa.array(cols[1], pa.string()),
                     "start_ns": pa.array(cols[2], pa.int64()), "end_ns": pa.array(cols[3], pa.int64()),
                     "clock": pa.array(cols[4], pa.string())})


TOKEN_TYPES = {"request_id": pa.string(), "index": pa.int32(), "emit_ns": pa.int64(), "kv_len": pa.int32(),
               "step_start_ns": pa.int64(), "step_end_ns": pa.int64(), "batch_size": pa.int32(),
               "client_recv_ns": pa.int64(), "step_id": pa.int64()}


def tokens(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Token rows as dicts; columns present in no row are left out (optional columns)."""
    names = [n for n in TOKEN_TYPES if any(n in r for r in rows)] or ["request_id", "index", "emit_ns"]
    return pa.table({n: pa.array([r.get(n) for r in rows], TOKEN_TYPES[n]) for n in names})


@dataclass
class Req:
    """One request of a scenario; times in milliseconds."""

    start: float = 0.0
    network: float | None = None      # None: no client side recorded
    tokenize: float | None = 1.0
    queue: float | None = None
    preprocess: float | None = None
    prefill: float = 50.0
    output: int = 100
    itl: float = 20.0
    detokenize: float | None = None
    postprocess: float | None = None
    prompt: int = 1000
    step: Callable[[int], float] | None = None  # kv_len -> step time (ms); None: no step columns
    batch: int | None = None


def scenario(directory: Path, reqs: Sequence[Req], *, model: Mapping[str, Any] | None = None,
             hardware: Mapping[str, Any] | None = None, requests_table: bool = True,
             extra: Mapping[str, pa.Table] | None = None) -> Path:
    """Write a trace where request i follows ``reqs[i]``: server phases back to back, token 0
    at the end of prefill, one token per ``itl`` after it, the client around the server."""
    span_rows: list[tuple[str, str, int, int, str]] = []
    tok_rows: list[dict[str, Any]] = []
    info = {"request_id": [], "prompt_tokens": [], "output_tokens": [], "status": []}
    for i, r in enumerate(reqs):
        rid = f"req-{i:03d}"
        t = round(r.start * MS)
        s0 = t
        for name in ("tokenize", "queue", "preprocess"):
            d = getattr(r, name)
            if d is not None:
                span_rows.append((rid, name, t, t + round(d * MS), "server"))
                t += round(d * MS)
        p0, first = t, t + round(r.prefill * MS)
        span_rows.append((rid, "prefill", p0, first, "server"))
        emits = [first + round(k * r.itl * MS) for k in range(r.output)]
        last = emits[-1]
        if r.output > 1:
            span_rows.append((rid, "decode", first, last, "server"))
        t = last
        for name in ("detokenize", "postprocess"):
            d = getattr(r, name)
            if d is not None:
                span_rows.append((rid, name, t, t + round(d * MS), "server"))
                t += round(d * MS)
        s1 = t
        span_rows.append((rid, "server.request", s0, s1, "server"))
        half = round((r.network or 0) * MS / 2)
        if r.network is not None:
            span_rows.append((rid, "client.request", CLIENT_OFFSET + s0 - half, CLIENT_OFFSET + s1 + half, "client"))
        for k, e in enumerate(emits):
            row: dict[str, Any] = {"request_id": rid, "index": k, "emit_ns": e, "kv_len": r.prompt + k}
            if r.network is not None:
                row["client_recv_ns"] = CLIENT_OFFSET + e + half
            if r.step is not None:
                dur = round(r.step(r.prompt + k) * MS) if k > 0 else round(r.prefill * MS)
                row["step_start_ns"], row["step_end_ns"] = e - dur, e
            if r.batch is not None:
                row["batch_size"] = r.batch
            tok_rows.append(row)
        info["request_id"].append(rid)
        info["prompt_tokens"].append(r.prompt)
        info["output_tokens"].append(r.output)
        info["status"].append("ok")
    tables: dict[str, pa.Table] = {"spans": spans(span_rows), "tokens": tokens(tok_rows)}
    if requests_table:
        tables["requests"] = pa.table({"request_id": pa.array(info["request_id"], pa.string()),
                                       "prompt_tokens": pa.array(info["prompt_tokens"], pa.int32()),
                                       "output_tokens": pa.array(info["output_tokens"], pa.int32()),
                                       "status": pa.array(info["status"], pa.string())})
    tables.update(extra or {})
    meta: dict[str, Any] = {"closed": True}
    if model:
        meta["model"] = dict(model)
    if hardware:
        meta["hardware"] = dict(hardware)
    return write_trace(directory, tables, meta)


def roofline_step(weight_bytes: float, kv_bytes: float, bw: float, batch: int, efficiency: float
                  ) -> Callable[[int], float]:
    """Step time (ms) of a decode that reaches ``efficiency`` of the memory roofline."""
    return lambda kv: (weight_bytes + batch * kv * kv_bytes) / bw * 1e3 / efficiency


LLAMA_8B_WEIGHT_BYTES = (8.03e9 - 128256 * 4096) * 2
LLAMA_8B_KV_BYTES = 131072.0


TOY_MODEL = {"name": "toy", "params": 1e9, "weight_bytes_per_param": 2, "kv_bytes_per_token": 1e5}
TOY_HARDWARE = {"gpu": "toy-gpu", "gpu_count": 1, "mem_bw_bytes_per_s": 1e12, "peak_flops": 1e14}


def toy_trace(directory: Path, *, with_meta: bool = True) -> Path:
    """Two requests with hand-computed expectations (see test_sql_*.py).

    ``a``: client and server, every phase but preprocess/detokenize, 4 tokens with
    step times and kv_len 1000..4000; ``b``: server only, 3 tokens, no kv_len, no steps.
    """
    c = CLIENT_OFFSET
    span_rows = [
        ("a", "client.request", c + 0, c + 150 * MS, "client"),
        ("a", "server.request", 10 * MS, 130 * MS, "server"),
        ("a", "queue", 10 * MS, 20 * MS, "server"),
        ("a", "tokenize", 20 * MS, 22 * MS, "server"),
        ("a", "prefill", 22 * MS, 50 * MS, "server"),
        ("a", "decode", 50 * MS, 110 * MS, "server"),
        ("a", "postprocess", 110 * MS, 115 * MS, "server"),
        ("b", "server.request", 200 * MS, 300 * MS, "server"),
        ("b", "prefill", 200 * MS, 240 * MS, "server"),
        ("b", "decode", 240 * MS, 280 * MS, "server"),
    ]
    tok_rows = [
        {"request_id": "a", "index": 0, "emit_ns": 50 * MS, "kv_len": 1000, "step_start_ns": 22 * MS,
         "step_end_ns": 50 * MS, "client_recv_ns": c + 65 * MS},
        {"request_id": "a", "index": 1, "emit_ns": 70 * MS, "kv_len": 2000, "step_start_ns": 58 * MS,
         "step_end_ns": 70 * MS, "client_recv_ns": c + 85 * MS},
        {"request_id": "a", "index": 2, "emit_ns": 90 * MS, "kv_len": 3000, "step_start_ns": 76 * MS,
         "step_end_ns": 90 * MS, "client_recv_ns": c + 107 * MS},
        {"request_id": "a", "index": 3, "emit_ns": 110 * MS, "kv_len": 4000, "step_start_ns": 94 * MS,
         "step_end_ns": 110 * MS, "client_recv_ns": c + 125 * MS},
        {"request_id": "b", "index": 2, "emit_ns": 280 * MS},  # rows out of order on purpose
        {"request_id": "b", "index": 0, "emit_ns": 240 * MS},
        {"request_id": "b", "index": 1, "emit_ns": 260 * MS},
    ]
    meta = {"model": TOY_MODEL, "hardware": TOY_HARDWARE} if with_meta else {}
    return write_trace(directory, {"spans": spans(span_rows), "tokens": tokens(tok_rows)}, meta)


def rows(con: Any, sql: str) -> list[dict[str, Any]]:
    """Rows of a query as dicts."""
    return con.sql(sql).to_arrow_table().to_pylist()
