"""A straightforward pandas implementation of tracetool's attribution (benchmark baseline only).

Same inputs and the same numbers as ``tracetool analyze --json`` for the parts
that carry the cost: per-request components by the attribution rule, TTFT,
TPOT, per-token ITL (client-side where recorded), e2e/TTFT/ITL/TPOT
percentiles, the decode fit of step time against kv_len (over all tokens and
per request), per-request and aggregate tokens/s, the roofline's ideal step and
bandwidth efficiency, and host time between steps. Written the way a pandas
user would: read the Arrow files, ``to_pandas()``, sort, ``groupby``.

    python benchmarks/pandas_baseline.py TRACE   # prints the summary as JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

PHASES = ["queue", "tokenize", "preprocess", "prefill", "decode", "detokenize", "postprocess"]
QS = [0.5, 0.9, 0.95, 0.99]
#: The tokens table's optional columns (docs/trace-format.md): a trace may leave any of them out.
TOKEN_OPTIONAL = {"kv_len": "Int64", "step_start_ns": "Int64", "step_end_ns": "Int64", "batch_size": "Int64",
                  "client_recv_ns": "Int64", "step_id": "Int64"}


def read(trace: Path, name: str) -> pd.DataFrame | None:
    path = trace / f"{name}.arrows"
    if not path.exists():
        return None
    with pa.memory_map(str(path)) as src:
        return pa.ipc.open_stream(src).read_all().to_pandas()


def pct(s: pd.Series) -> dict[str, float | None]:
    s = s.dropna()
    if s.empty:
        return {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None}
    q = s.quantile(QS).to_numpy()
    return {"mean": float(s.mean()), "p50": q[0], "p90": q[1], "p95": q[2], "p99": q[3]}


def fit(x: pd.Series, y: pd.Series) -> dict[str, float]:
    m = x.notna() & y.notna()
    x, y = x[m].astype(float), y[m]
    slope = x.cov(y) / x.var()
    base = y.mean() - slope * x.mean()
    return {"base_ms": float(base), "per_1k_kv_ms": float(slope * 1000), "r2": float(x.corr(y) ** 2)}


def step_fit(st: pd.DataFrame) -> dict[str, float]:
    """Batched traces: decode-only step time against summed kv_tokens and batch size; batch size
    left out when it barely varies or moves with the KV tokens (squared correlation above 0.9)."""
    x, z, y = st["kv_tokens"].astype(float), st["batch_size"].astype(float), st["step_ms"]
    r2_xz = x.corr(z) ** 2 if z.var() > 0 else 1.0
    if r2_xz > 0.9:
        out = fit(x, y)
        return out
    a_mat = np.column_stack([np.ones(len(x)), x, z])
    coef, *_ = np.linalg.lstsq(a_mat, y.to_numpy(), rcond=None)
    resid = y.to_numpy() - a_mat @ coef
    return {"base_ms": float(coef[0]), "per_1k_kv_ms": float(coef[1] * 1000),
            "r2": float(1 - (resid ** 2).sum() / ((y - y.mean()) ** 2).sum())}


def analyze(trace: Path) -> dict[str, object]:
    meta = json.loads((trace / "meta.json").read_text())
    spans = read(trace, "spans")
    tok = read(trace, "tokens")
    assert spans is not None and tok is not None
    for col in TOKEN_OPTIONAL:  # columns the trace left out: all null, as the format reads them
        if col not in tok:
            tok[col] = np.nan
    info = read(trace, "requests")
    if info is not None and "server_scope" in info and (info["server_scope"] == "engine").any():
        # frontend = client time outside the engine's span beyond the timed round trips: not reproduced
        raise SystemExit("pandas_baseline: server_scope 'engine' traces (the frontend component) are not covered")
    # --- per-request components (attribution rule) ---
    spans["dur"] = spans["end_ns"] - spans["start_ns"]
    piv = spans.pivot_table(index="request_id", columns="name", values="dur", aggfunc="sum")
    starts = spans.pivot_table(index="request_id", columns="name", values="start_ns", aggfunc="min")
    req = pd.DataFrame(index=piv.index)
    client = piv.get("client.request")
    server = piv.get("server.request")
    req["e2e_ms"] = (client if client is not None else server) / 1e6
    req["network_ms"] = (client - server) / 1e6 if client is not None and server is not None else np.nan
    # a scheduled load client's wait (client.queue; the benchmark's traces have none, so it is
    # only a column here: e2e and TTFT from the intended send time are not reproduced)
    req["client_queue_ms"] = piv["client.queue"] / 1e6 if "client.queue" in piv else np.nan
    # the server's frontend: measured only where server.request is the engine's span (refused above)
    req["frontend_ms"] = np.nan
    for p in PHASES:
        req[f"{p}_ms"] = piv[p] / 1e6 if p in piv else np.nan
    phase_sum = sum(piv[p].fillna(0) for p in PHASES if p in piv)
    req["other_ms"] = (server - phase_sum).clip(lower=0) / 1e6 if server is not None else np.nan
    # --- tokens: sort, gaps ---
    tok = tok.sort_values(["request_id", "index"])
    g = tok.groupby("request_id", sort=False)
    tok["client_gap"] = g["client_recv_ns"].diff()
    tok["server_gap"] = g["emit_ns"].diff()
    tok["itl_ms"] = tok["client_gap"].fillna(tok["server_gap"]) / 1e6
    tok["step_ms"] = (tok["step_end_ns"] - tok["step_start_ns"]) / 1e6
    tok["host_ms"] = tok["server_gap"] / 1e6 - tok["step_ms"]
    dec = tok[(tok["index"] > 0) & tok["server_gap"].notna()]
    emissions = dec[dec["itl_ms"] > 0]  # tokens streamed together count once (vLLM bench serve)
    first = tok[tok["index"] == 0].set_index("request_id")
    n_out = g.size()
    # --- TTFT / TPOT ---
    client_start = starts.get("client.request", None)
    server_start = starts.get("server.request", None)
    req["output_tokens"] = n_out.reindex(req.index)
    if client_start is not None and first["client_recv_ns"].notna().any():
        req["ttft_ms"] = (first["client_recv_ns"].reindex(req.index) - client_start) / 1e6
        side_e2e = client / 1e6
    else:
        req["ttft_ms"] = (first["emit_ns"].reindex(req.index) - server_start) / 1e6
        side_e2e = server / 1e6
    req["tpot_ms"] = (side_e2e - req["ttft_ms"]) / (req["output_tokens"] - 1)
    req.loc[req["output_tokens"] < 2, "tpot_ms"] = np.nan
    total_e2e = req["e2e_ms"].sum()
    components = {}
    for c in ["client_queue", "network", "frontend", *PHASES, "other"]:
        col = req[f"{c}_ms"]
        components[c] = {"ms": float(col.mean()) if col.notna().any() else None,
                         "share": float(col.sum() / total_e2e) if col.notna().any() else None,
                         "measured": bool(col.notna().any())}
    measured = {k: v["share"] for k, v in components.items() if v["share"] is not None}
    bottleneck = max(measured, key=lambda k: measured[k]) if measured else None
    # --- decode fit: all tokens and per request ---
    steps = read(trace, "steps")
    dsteps = None
    if steps is not None:
        steps["step_ms"] = (steps["end_ns"] - steps["start_ns"]) / 1e6
        dsteps = steps[(steps["prefill_tokens"] == 0) & (steps["decode_tokens"] > 0)]
    batched = dsteps is not None and len(dsteps) >= 3 and dsteps["batch_size"].max() > 1
    fit_all = step_fit(dsteps) if batched else fit(dec["kv_len"], dec["step_ms"])
    per_req_fit = dec.groupby("request_id").apply(
        lambda d: pd.Series(fit(d["kv_len"], d["step_ms"])), include_groups=False)
    # --- throughput ---
    per_request_tok_s = float((1000 / req["tpot_ms"]).mean())
    server_spans = spans[spans.clock == "server"]  # none in a client-only trace: the tokens alone
    wall_s = (np.nanmax([server_spans["end_ns"].max(), tok["emit_ns"].max()])
              - np.nanmin([server_spans["start_ns"].min(), tok["emit_ns"].min()])) / 1e9
    aggregate_tok_s = len(tok) / wall_s
    # --- roofline ---
    m, h = meta["model"], meta["hardware"]
    weight = (m["params"] - m["vocab"] * m["hidden"]) * m["weight_bytes_per_param"]
    kvb = 2 * m["layers"] * m["kv_heads"] * m["head_dim"] * m["kv_bytes_per_elem"]
    bw = h["mem_bw_bytes_per_s"] * h["gpu_count"]
    if batched:  # per decode-only iteration: the weights once, the batch's summed KV
        ideal = (weight + dsteps["kv_tokens"].astype(float) * kvb) / bw * 1000
        measured = dsteps["step_ms"]
    else:
        rd = dec[dec["kv_len"].notna() & dec["step_ms"].notna()]
        ideal = (weight + rd["batch_size"].fillna(1).astype(float) * rd["kv_len"].astype(float) * kvb) / bw * 1000
        measured = rd["step_ms"]
    roofline = {"ideal_step_ms": float(ideal.mean()),
                "bandwidth_efficiency": float(ideal.mean() / measured.mean())}
    return {
        "requests": len(req),
        "e2e_ms": pct(req["e2e_ms"]), "ttft_ms": pct(req["ttft_ms"]),
        "itl_ms": pct(emissions["itl_ms"]), "tpot_ms": pct(req["tpot_ms"]),
        "components": components, "bottleneck": bottleneck,
        "decode": {"per_request_tok_s": per_request_tok_s, "aggregate_tok_s": aggregate_tok_s,
                   "fit": fit_all, "roofline": roofline,
                   "per_request_fits": len(per_req_fit)},
        "host_mean_ms": float(dec["host_ms"].mean()),
    }


if __name__ == "__main__":
    print(json.dumps(analyze(Path(sys.argv[1])), indent=2, default=float))
