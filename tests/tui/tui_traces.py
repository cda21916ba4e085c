"""Small, realistic traces for the TUI tests, written with plain pyarrow from docs/trace-format.md.

* :func:`chat_trace`: a decode-dominant chat (Llama 3.1 8B on one H100 SXM, batch 4):
  client and server spans, per-token kv_len and step times that follow the memory
  roofline at 70 % efficiency, NVML samples every 50 ms (coarser than a step) and
  py-spy samples by category. Decode holds ~92 % of e2e; the network ~2 %.
* :func:`xregion_trace`: a cross-region link and four-token answers: the network
  (180 ms round trip) really is the problem. No gpu or stacks tables.
* :func:`tail_trace`: 400 requests queueing behind Poisson arrivals at an engine with four slots
  (tests/analyzers/tail_scenarios.py, seeded): the p99 TTFT is queueing, and the tail arrived
  when many requests were in flight.
* :func:`bad_trace`: a tokens file that is not Arrow.
* :func:`two_servers`: a dataset, the sample traces copied under ``server=a/`` and ``server=b/``.

Everything is deterministic: no clocks, and random numbers only from fixed seeds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
MS = 1_000_000
CLIENT_OFFSET = 9_000_000_000_000  # the client's clock is unrelated to the server's
T0 = 1_000_000_000_000

LLAMA_8B = {"name": "Llama 3.1 8B", "params": 8.03e9, "layers": 32, "kv_heads": 8, "head_dim": 128,
            "hidden": 4096, "vocab": 128256, "weight_bytes_per_param": 2, "kv_bytes_per_elem": 2}
H100 = {"gpu": "H100 SXM", "gpu_count": 1, "mem_bw_bytes_per_s": 3.35e12, "peak_flops": 9.89e14}
WEIGHT_BYTES = (8.03e9 - 128256 * 4096) * 2
KV_BYTES = 131072


def _write(directory: Path, tables: dict[str, pa.Table], meta: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "meta.json").write_text(json.dumps({"format": "tracetool", "version": 1, "closed": True, **meta}))
    for name, table in tables.items():
        with pa.OSFile(str(directory / f"{name}.arrows"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
            w.write_table(table)
    return directory


def _spans(rows: list[tuple[str, str, int, int, str]]) -> pa.Table:
    r, n, s, e, c = zip(*rows, strict=True)
    return pa.table({"request_id": pa.array(r, pa.string()), "name": pa.array(n, pa.string()),
                     "start_ns": pa.array(s, pa.int64()), "end_ns": pa.array(e, pa.int64()),
                     "clock": pa.array(c, pa.string())})


def _requests(rows: list[tuple[str, int, int]]) -> pa.Table:
    r, p, o = zip(*rows, strict=True)
    return pa.table({"request_id": pa.array(r, pa.string()), "prompt_tokens": pa.array(p, pa.int32()),
                     "output_tokens": pa.array(o, pa.int32()), "status": pa.array(["ok"] * len(r), pa.string())})


def _request(rid: str, start: int, *, network_ms: float, tokenize_ms: float, queue_ms: float, prefill_ms: float,
             prompt: int, output: int, step_ms: Any, host_ms: float, batch: int | None, spans: list[Any],
             tokens: dict[str, list[Any]], tail_ms: tuple[float, float] = (0.5, 0.3)) -> tuple[int, int]:
    """Append one request's spans and tokens; returns its server start and end (ns)."""
    t = start
    spans.append((rid, "tokenize", t, t + round(tokenize_ms * MS), "server"))
    t += round(tokenize_ms * MS)
    spans.append((rid, "queue", t, t + round(queue_ms * MS), "server"))
    t += round(queue_ms * MS)
    first = t + round(prefill_ms * MS)
    spans.append((rid, "prefill", t, first, "server"))
    emit = first
    half = round(network_ms * MS / 2)
    for k in range(output):
        kv = prompt + k
        if k == 0:
            s0, s1 = t, first
        else:
            step = round(step_ms(kv) * MS)
            s0 = emit + round(host_ms * MS)
            s1 = s0 + step
            emit = s1
        tokens["request_id"].append(rid)
        tokens["index"].append(k)
        tokens["emit_ns"].append(emit)
        tokens["kv_len"].append(kv)
        tokens["step_start_ns"].append(s0)
        tokens["step_end_ns"].append(s1)
        tokens["batch_size"].append(batch)
        tokens["client_recv_ns"].append(CLIENT_OFFSET + emit + half)
    if output > 1:
        spans.append((rid, "decode", first, emit, "server"))
    detok_end = emit + round(tail_ms[0] * MS)
    end = detok_end + round(tail_ms[1] * MS)
    spans.append((rid, "detokenize", emit, detok_end, "server"))
    spans.append((rid, "postprocess", detok_end, end, "server"))
    spans.append((rid, "server.request", start, end, "server"))
    spans.append((rid, "client.request", CLIENT_OFFSET + start - half, CLIENT_OFFSET + end + half, "client"))
    return start, end


def _token_table(tokens: dict[str, list[Any]]) -> pa.Table:
    types = {"request_id": pa.string(), "index": pa.int32(), "emit_ns": pa.int64(), "kv_len": pa.int32(),
             "step_start_ns": pa.int64(), "step_end_ns": pa.int64(), "batch_size": pa.int32(),
             "client_recv_ns": pa.int64()}
    return pa.table({k: pa.array(v, types[k]) for k, v in tokens.items()})


def chat_trace(directory: Path, requests: int = 8, output: int = 300) -> Path:
    """Decode-dominant chat: ~92 % decode, 40 ms network, memory-bound steps at 70 % of the roofline."""
    spans: list[Any] = []
    tokens: dict[str, list[Any]] = {k: [] for k in ("request_id", "index", "emit_ns", "kv_len", "step_start_ns",
                                                     "step_end_ns", "batch_size", "client_recv_ns")}
    batch = 4

    def step(kv: int) -> float:
        return (WEIGHT_BYTES + batch * kv * KV_BYTES) / H100["mem_bw_bytes_per_s"] * 1e3 / 0.7

    info, windows = [], []
    for i in range(requests):
        rid = f"chat-{i:02d}"
        prompt = 1500 + 250 * i
        out = output + 40 * (i % 3)
        s, e = _request(rid, T0 + i * 150 * MS, network_ms=40 + i, tokenize_ms=1.5 + 0.1 * i, queue_ms=3 + i,
                        prefill_ms=120 + 10 * i, prompt=prompt, output=out, step_ms=step, host_ms=0.4, batch=batch,
                        spans=spans, tokens=tokens)
        info.append((rid, prompt, out))
        windows.append((s, e))
    end = max(e for _, e in windows)
    gpu_ts = list(range(T0, end + 50 * MS, 50 * MS))
    busy = [any(s <= ts <= e for s, e in windows) for ts in gpu_ts]
    gpu = pa.table({
        "ts_ns": pa.array(gpu_ts, pa.int64()), "gpu": pa.array([0] * len(gpu_ts), pa.int32()),
        "sm_util_pct": pa.array([92.0 + (k % 5) if b else 3.0 for k, b in enumerate(busy)], pa.float64()),
        "dram_bw_util_pct": pa.array([61.0 + (k % 7) if b else 1.0 for k, b in enumerate(busy)], pa.float64()),
        "mem_util_pct": pa.array([55.0 + (k % 4) if b else 1.0 for k, b in enumerate(busy)], pa.float64()),
        "power_w": pa.array([520.0 + 3 * (k % 9) if b else 90.0 for k, b in enumerate(busy)], pa.float64()),
    })
    cats = ("model-forward",) * 7 + ("sampling", "detokenize", "network-io")
    st_ts = list(range(T0, end, 10 * MS))
    stacks = pa.table({
        "ts_ns": pa.array(st_ts, pa.int64()), "thread": pa.array(["MainThread"] * len(st_ts), pa.string()),
        "category": pa.array([("tokenize" if k % 40 == 0 else cats[k % len(cats)]) for k in range(len(st_ts))],
                             pa.string()),
        "stack": pa.array(["server.py:serve;engine.py:step"] * len(st_ts), pa.string()),
        "weight": pa.array([1] * len(st_ts), pa.int32()),
    })
    tables = {"spans": _spans(spans), "tokens": _token_table(tokens), "requests": _requests(info), "gpu": gpu,
              "stacks": stacks}
    return _write(directory, tables, {"model": LLAMA_8B, "hardware": H100})


def xregion_trace(directory: Path, requests: int = 12) -> Path:
    """Cross-region link, four-token answers: the network (~180 ms) holds most of e2e."""
    spans: list[Any] = []
    tokens: dict[str, list[Any]] = {k: [] for k in ("request_id", "index", "emit_ns", "kv_len", "step_start_ns",
                                                     "step_end_ns", "batch_size", "client_recv_ns")}
    info = []
    for i in range(requests):
        rid = f"xr-{i:02d}"
        _request(rid, T0 + i * 300 * MS, network_ms=176 + (i % 4) * 3, tokenize_ms=0.3, queue_ms=1.0,
                 prefill_ms=24 + (i % 3), prompt=300 + 10 * i, output=4, step_ms=lambda kv: 7.5 + kv / 10000,
                 host_ms=0.5, batch=None, spans=spans, tokens=tokens)
        info.append((rid, 300 + 10 * i, 4))
    tables = {"spans": _spans(spans), "tokens": _token_table(tokens), "requests": _requests(info)}
    return _write(directory, tables, {})


def bad_trace(directory: Path) -> Path:
    """meta.json is fine; tokens.arrows is not an Arrow stream."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "meta.json").write_text(json.dumps({"format": "tracetool", "version": 1}))
    (directory / "tokens.arrows").write_bytes(b"this is not arrow at all" * 4)
    return directory


def empty_trace(directory: Path) -> Path:
    """Readable, but nothing to analyse: a spans table with no rows."""
    return _write(directory, {"spans": pa.table({"request_id": pa.array([], pa.string()),
                                                 "name": pa.array([], pa.string()),
                                                 "start_ns": pa.array([], pa.int64()),
                                                 "end_ns": pa.array([], pa.int64()),
                                                 "clock": pa.array([], pa.string())})}, {})


def two_servers(root: Path) -> Path:
    """A dataset of two servers: server=a holds chat and network, server=b holds queueing (the
    sample traces of sample_traces/, copied)."""
    for server, names in (("a", ("chat", "network")), ("b", ("queueing",))):
        for name in names:
            shutil.copytree(SAMPLES / name, root / f"server={server}" / name)
    return root


def tail_trace(directory: Path) -> Path:
    from tests.analyzers.tail_scenarios import queue_bursts

    return queue_bursts(directory, n=400, seed=0).path
