"""Generate a large, realistic v1 trace of a continuous-batching server (benchmarks only).

The trace looks like what tracetool's collectors write for a batched server
serving Llama 3.1 8B on one H100 SXM: ``slots`` sequences decode side by side,
every engine step emits one token per active sequence, step time follows the
roofline (weights + the batch's KV cache over bandwidth at ~70 % efficiency)
plus noise, rows are in time order (requests interleaved) and written as Arrow
IPC streams in 65,536-row batches, as ``TraceWriter`` does. Client spans and
``client_recv_ns`` sit on a separate, offset clock with ~20 ms one-way delay.

    python benchmarks/gen_trace.py /tmp/tt-bench-10m --tokens 10000000

``--shape`` picks which of the format's shapes is written (the same engine and numbers underneath):

* ``a``: a batched server's own trace: server spans, tokens with ``step_id``, a ``steps`` table,
  GPU samples (what tracetool's collectors write on an engine);
* ``b``: what a third-party engine writes first, with plain pyarrow: server spans and tokens with
  ``step_start_ns``/``step_end_ns`` but no ``step_id`` column and no ``steps`` table, no client
  clock, 500 tokens per request on average;
* ``c``: a client-only trace, as ``tracetool probe`` writes against a server that reports nothing:
  ``client.request`` spans, tokens with ``client_recv_ns`` (``emit_ns`` the same instant), no step
  times, no batch sizes;
* ``d``: shape ``a`` with 256 sequences per step instead of 64 (many requests per step);
* ``e``: a merged client+server trace (``tracetool merge``): shape ``a`` plus ``client.request``
  spans, ``tokens.client_recv_ns`` and a ``clock_offsets`` table (the default, and the shape
  this generator always wrote).

Generated data is synthetic and says so in ``meta.json`` (``notes``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

BATCH_ROWS = 65_536
MODEL = {"name": "Llama 3.1 8B", "params": 8.03e9, "layers": 32, "kv_heads": 8, "head_dim": 128,
         "hidden": 4096, "vocab": 128256, "weight_bytes_per_param": 2, "kv_bytes_per_elem": 2}
HARDWARE = {"gpu": "H100 SXM", "gpu_count": 1, "mem_bw_bytes_per_s": 3.35e12, "peak_flops": 9.89e14}
WEIGHT_BYTES = (8.03e9 - 128256 * 4096) * 2
KV_BYTES = 131_072
CLIENT_OFFSET_NS = 7_000_000_000_000  # the client's clock is unrelated to the server's
T0 = 1_700_000_000_000_000_000
#: Which shape (see the module docstring) has what: (step ids and a steps table, step times,
#: server spans, client clock, concurrent sequences, mean output tokens per request).
SHAPES = {
    "a": dict(steps=True, step_times=True, server=True, client=False, slots=64, mean_out=1000),
    "b": dict(steps=False, step_times=True, server=True, client=False, slots=64, mean_out=500),
    "c": dict(steps=False, step_times=False, server=False, client=True, slots=64, mean_out=1000),
    "d": dict(steps=True, step_times=True, server=True, client=False, slots=256, mean_out=1000),
    "e": dict(steps=True, step_times=True, server=True, client=True, slots=64, mean_out=1000),
}


def generate(out: Path, tokens: int, slots: int | None = None, seed: int = 0, shape: str = "e") -> dict[str, int]:
    sh = SHAPES[shape]
    slots = int(sh["slots"]) if slots is None else slots
    rng = np.random.default_rng(seed)
    mean_out = int(sh["mean_out"])
    n_req = max(1, tokens // mean_out)
    out_len = rng.integers(200, 2 * mean_out - 200 + 1, n_req)
    # exact total: scale to it, then put the rounding remainder on the longest requests
    out_len = np.maximum(1, np.floor(out_len * (tokens / out_len.sum()))).astype(np.int64)
    rest = tokens - int(out_len.sum())
    if rest < 0 or n_req > tokens:
        raise SystemExit("--tokens too small for this generator")
    out_len[np.argsort(-out_len, kind="stable")[:rest]] += 1
    prompt = rng.integers(100, 4001, n_req)
    slot = np.arange(n_req) % slots
    gap_steps = rng.integers(1, 4, n_req)  # queue + tokenize, in steps, before the prefill step
    # Each slot runs its requests back to back: first step of request = previous end + gap.
    span_steps = out_len + gap_steps
    first_step = np.empty(n_req, np.int64)
    for s in range(slots):
        m = slot == s
        c = np.cumsum(span_steps[m])
        first_step[m] = c - out_len[m]
    req_of_tok = np.repeat(np.arange(n_req), out_len)
    starts = np.cumsum(out_len) - out_len
    index = (np.arange(tokens) - np.repeat(starts, out_len)).astype(np.int32)
    step = first_step[req_of_tok] + index
    kv_len = (prompt[req_of_tok] + index).astype(np.int32)
    n_steps = int(step.max()) + 1
    batch = np.bincount(step, minlength=n_steps)
    kv_total = np.bincount(step, weights=kv_len, minlength=n_steps)
    prefill_tok = np.bincount(first_step, weights=prompt, minlength=n_steps)
    ideal_ms = (WEIGHT_BYTES + kv_total * KV_BYTES) / HARDWARE["mem_bw_bytes_per_s"] * 1e3
    step_ms = ideal_ms / 0.7 + prefill_tok * 2 * 8.03e9 / 9.89e14 / 0.5 * 1e3 + rng.gamma(4, 0.05, n_steps)
    host_ms = 0.25 + rng.gamma(2, 0.05, n_steps)  # scheduler/sampling between steps
    step_end = T0 + np.cumsum((step_ms + host_ms) * 1e6).astype(np.int64)
    step_start = step_end - (step_ms * 1e6).astype(np.int64)
    order = np.lexsort((slot[req_of_tok], step))  # time order, requests interleaved
    req_of_tok, index, step, kv_len = req_of_tok[order], index[order], step[order], kv_len[order]
    emit = step_end[step] + 30_000
    one_way = (20e6 + rng.gamma(2, 1e6, n_req)).astype(np.int64)
    recv = emit + CLIENT_OFFSET_NS + one_way[req_of_tok] + rng.integers(0, 200_000, tokens)
    names = pa.array([f"cmpl-{i:07d}" for i in range(n_req)], pa.string())
    out.mkdir(parents=True, exist_ok=True)
    if not sh["server"]:  # a probe: the server clock is the client's, emit_ns the receipt (no one-way estimate)
        emit = recv
    tok_cols = {"request_id": names.take(pa.array(req_of_tok)), "index": pa.array(index, pa.int32()),
                "emit_ns": pa.array(emit), "kv_len": pa.array(kv_len, pa.int32())}
    if sh["step_times"]:
        tok_cols.update(step_start_ns=pa.array(step_start[step]), step_end_ns=pa.array(step_end[step]),
                        batch_size=pa.array(batch[step].astype(np.int32)))
    if sh["client"]:
        tok_cols["client_recv_ns"] = pa.array(recv)
    if sh["steps"]:
        tok_cols["step_id"] = pa.array(step.astype(np.int64))
    _write_stream(out / "tokens.arrows", pa.table(tok_cols))
    del tok_cols
    # Spans: arrival two steps before the prefill step, tokenize then queue, prefill, decode, tail.
    first_emit = step_end[first_step] + 30_000
    last_emit = step_end[first_step + out_len - 1] + 30_000
    arrive = step_start[np.maximum(first_step - gap_steps, 0)] - 1_000_000
    tok_end = arrive + (prompt * 800).astype(np.int64)  # ~0.8 us per prompt token
    prefill_start = step_start[first_step]
    detok_end = last_emit + 200_000
    server_end = detok_end + 400_000
    rid = np.arange(n_req)
    client_span = ("client.request", arrive - one_way + CLIENT_OFFSET_NS, server_end + one_way + CLIENT_OFFSET_NS,
                   "client")
    span_rows = [
        ("server.request", arrive, server_end, "server"), ("tokenize", arrive, tok_end, "server"),
        ("queue", tok_end, prefill_start, "server"), ("prefill", prefill_start, first_emit, "server"),
        ("decode", first_emit, last_emit, "server"), ("detokenize", last_emit, detok_end, "server"),
        ("postprocess", detok_end, server_end, "server"),
    ] if sh["server"] else []
    if sh["client"]:
        span_rows.append(client_span)
    spans = pa.table({
        "request_id": pa.concat_arrays([names.take(pa.array(rid)) for _ in span_rows]),
        "name": pa.array(np.repeat([r[0] for r in span_rows], n_req)),
        "start_ns": pa.array(np.concatenate([r[1] for r in span_rows])),
        "end_ns": pa.array(np.concatenate([r[2] for r in span_rows])),
        "clock": pa.array(np.repeat([r[3] for r in span_rows], n_req)),
    })
    _write_stream(out / "spans.arrows", spans)
    if sh["server"] and sh["client"]:  # merged: per joined request, the clocks' offset and the network time
        _write_stream(out / "clock_offsets.arrows", pa.table({
            "request_id": names, "offset_ns": pa.array(np.full(n_req, -CLIENT_OFFSET_NS, np.int64)),
            "network_ns": pa.array(2 * one_way)}))
    info = {"requests": n_req, "tokens": tokens, "steps": n_steps if sh["steps"] else 0}
    if sh["server"]:
        _write_stream(out / "requests.arrows", pa.table({
            "request_id": names, "prompt_tokens": pa.array(prompt.astype(np.int32)),
            "output_tokens": pa.array(out_len.astype(np.int32)), "status": pa.array(["ok"] * n_req)}))
    else:
        _write_stream(out / "requests.arrows", pa.table({
            "request_id": names, "output_tokens": pa.array(out_len.astype(np.int32)),
            "status": pa.array(["ok"] * n_req)}))
    meta = {"format": "tracetool", "version": 1, "model": MODEL, "hardware": HARDWARE, "closed": True,
            "notes": [f"synthetic benchmark trace from benchmarks/gen_trace.py (shape {shape}, seed {seed})"],
            "dropped_rows": {}}
    if not sh["steps"]:
        (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        return info
    _write_stream(out / "steps.arrows", pa.table({
        "step_id": pa.array(np.arange(n_steps, dtype=np.int64)), "start_ns": pa.array(step_start),
        "end_ns": pa.array(step_end), "batch_size": pa.array(batch.astype(np.int32)),
        "prefill_tokens": pa.array(prefill_tok.astype(np.int32)),
        "decode_tokens": pa.array((batch - np.bincount(first_step, minlength=n_steps)).astype(np.int32)),
        "kv_tokens": pa.array(kv_total.astype(np.int64)),
    }))
    ts = np.arange(int(step_start[0]), int(step_end[-1]), 100_000_000, dtype=np.int64)
    _write_stream(out / "gpu.arrows", pa.table({
        "ts_ns": pa.array(ts), "gpu": pa.array(np.zeros(len(ts), np.int32)),
        "sm_util_pct": pa.array(rng.normal(96, 2, len(ts)).clip(0, 100)),
        "dram_bw_util_pct": pa.array(rng.normal(68, 4, len(ts)).clip(0, 100)),
        "power_w": pa.array(rng.normal(600, 30, len(ts))),
    }))
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return info


def _write_stream(path: Path, table: pa.Table) -> None:
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        for batch in table.to_batches(max_chunksize=BATCH_ROWS):
            w.write_batch(batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokens", type=int, default=10_000_000)
    ap.add_argument("--slots", type=int, default=None, help="concurrent sequences (default: the shape's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="e", help="which trace shape (module docstring)")
    a = ap.parse_args()
    t = time.perf_counter()
    info = generate(a.out, a.tokens, a.slots, a.seed, a.shape)
    print(f"wrote {a.out}: {info} in {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
