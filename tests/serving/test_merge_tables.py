"""merge keeps every table of both sides: a probe's scraped engine metrics
survive the join and give the same ``engine`` object as the client trace alone; what cannot be
kept is said in meta.json's notes and in merge's report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.conftest import make_trace, spans_table
from tracetool.merge import merge_traces
from tracetool.reader import open_trace

MS = 1_000_000
BASE = 1000_000 * MS  # the server's clock is unrelated to the client's


def metrics(rows: list[tuple[int, str, dict[str, str], float]], clock: str) -> pa.Table:
    ts, names, labels, values = zip(*rows, strict=True)
    return pa.table({"ts_ns": pa.array(ts, pa.int64()), "name": pa.array(names, pa.string()),
                     "labels": pa.array([json.dumps(lab, sort_keys=True) for lab in labels], pa.string()),
                     "value": pa.array(values, pa.float64()), "clock": pa.array([clock] * len(ts), pa.string())})


def vllm_scrapes(t0: int, *, waiting: tuple[float, float, float]) -> list[tuple[int, str, dict[str, str], float]]:
    """Three scrapes of a vLLM /metrics: before the first request, in the middle, after the last;
    a queue-time histogram that saw two requests (0.05 s and 0.25 s) in the run."""
    q = "vllm:request_queue_time_seconds"
    rows: list[tuple[int, str, dict[str, str], float]] = []
    for i, ts in enumerate((t0 - 50 * MS, t0 + 50 * MS, t0 + 200 * MS)):
        m = {"model_name": "smollm2"}
        rows.append((ts, "vllm:num_requests_waiting", m, waiting[i]))
        rows.append((ts, "vllm:kv_cache_usage_perc", m, [0.0, 0.4, 0.1][i]))
        rows.append((ts, "vllm:num_preemptions_total", m, [3.0, 3.0, 4.0][i]))
        done = [0.0, 1.0, 2.0][i]
        rows += [(ts, f"{q}_bucket", {**m, "le": "0.1"}, min(done, 1.0)),
                 (ts, f"{q}_bucket", {**m, "le": "0.3"}, done),
                 (ts, f"{q}_bucket", {**m, "le": "+Inf"}, done),
                 (ts, f"{q}_sum", m, [0.0, 0.05, 0.30][i]), (ts, f"{q}_count", m, done)]
    return rows


#: what the probe writes into meta.json about its scraping (collectors/prometheus.py)
SCRAPE_META = {"url": "http://127.0.0.1:8000/metrics", "interval_s": 1.0, "clock": "client", "scrapes": 3}


def client_trace(directory: Path, extra: dict[str, pa.Table] | None = None) -> Path:
    """A probe's trace: two requests over [0, 150] ms of the client clock, the engine scraped."""
    spans = spans_table([("r1", "client.request", 0, 100 * MS, "client"),
                         ("r2", "client.request", 20 * MS, 150 * MS, "client")])
    tokens = pa.table({"request_id": ["r1", "r1", "r2", "r2"], "index": pa.array([0, 1, 0, 1], pa.int32()),
                       "emit_ns": pa.array([40 * MS, 90 * MS, 60 * MS, 140 * MS], pa.int64()),
                       "client_recv_ns": pa.array([40 * MS, 90 * MS, 60 * MS, 140 * MS], pa.int64())})
    requests = pa.table({"request_id": ["r1", "r2"], "output_tokens": pa.array([2, 2], pa.int32()),
                         "status": ["ok", "ok"]})
    tables = {"spans": spans, "tokens": tokens, "requests": requests,
              "server_metrics": metrics(vllm_scrapes(0, waiting=(0.0, 1.0, 0.0)), "client"), **(extra or {})}
    return make_trace(directory, tables, {"clocks": {"client": "probe clock"}, "server_metrics": SCRAPE_META})


def server_trace(directory: Path, extra: dict[str, pa.Table] | None = None) -> Path:
    """The same two requests as a server recorded them (its clock is BASE later, 5 ms in)."""
    spans = spans_table([("r1", "server.request", BASE + 5 * MS, BASE + 95 * MS, "server"),
                         ("r2", "server.request", BASE + 25 * MS, BASE + 145 * MS, "server")])
    tokens = pa.table({"request_id": ["r1", "r1", "r2", "r2"], "index": pa.array([0, 1, 0, 1], pa.int32()),
                       "emit_ns": pa.array([BASE + 39 * MS, BASE + 89 * MS, BASE + 59 * MS, BASE + 139 * MS],
                                           pa.int64())})
    return make_trace(directory, {"spans": spans, "tokens": tokens, **(extra or {})})


def engine(cli: Any, trace: Path) -> dict[str, Any]:
    r = cli("analyze", trace, "--json")
    assert r.code == 0, r.err
    return json.loads(r.out)["engine"]


def test_merge_keeps_the_probes_engine_metrics(tmp_path: Path, cli: Any) -> None:
    """A real vLLM probed with --metrics-url auto, merged with its server trace: the joined trace
    had no server_metrics and its engine object was null."""
    client = client_trace(tmp_path / "client")
    merge_traces(client, server_trace(tmp_path / "server"), tmp_path / "joined")
    joined = open_trace(tmp_path / "joined")
    assert joined.rows("server_metrics") == open_trace(client).rows("server_metrics")
    assert joined.meta["server_metrics"] == SCRAPE_META and not [n for n in joined.meta["notes"] if "not kept" in n]
    alone, merged = engine(cli, client), engine(cli, tmp_path / "joined")
    assert alone is not None and alone["queue_time_ms"]["n"] == 2 and alone["preemptions"] == 1
    assert alone["clock"] == "client" and alone["requests_waiting"]["max"] == 1
    assert merged == alone


def test_metrics_of_both_sides_are_kept_each_on_its_clock(tmp_path: Path, cli: Any) -> None:
    """The server's recording process scraped too (server clock): both sets of rows are kept and
    the analysis reads one clock's, the client's, as the client trace alone does."""
    server_rows = vllm_scrapes(BASE, waiting=(5.0, 7.0, 5.0))
    client = client_trace(tmp_path / "client")
    server = server_trace(tmp_path / "server", {"server_metrics": metrics(server_rows, "server")})
    merge_traces(client, server, tmp_path / "joined")
    sm = open_trace(tmp_path / "joined").table("server_metrics")
    clocks = sm.column("clock").to_pylist()
    assert clocks.count("client") == clocks.count("server") == len(server_rows)
    assert engine(cli, tmp_path / "joined") == engine(cli, client)


def test_what_cannot_be_kept_is_said(tmp_path: Path, cli: Any) -> None:
    """Tables one side has are copied; a table both have without a clock to tell their rows apart
    (two hosts' gpu samples), or rows on a clock both sides use, keep the server's, and the note
    says what was left out, in meta.json and in merge's report."""
    gpu = pa.table({"ts_ns": pa.array([BASE], pa.int64()), "gpu": pa.array([0], pa.int32())})
    client_gpu = pa.table({"ts_ns": pa.array([10 * MS, 20 * MS], pa.int64()), "gpu": pa.array([0, 0], pa.int32())})
    notes = pa.table({"what": ["a user's own table"]})
    client = client_trace(tmp_path / "client", {"gpu": client_gpu, "probe_notes": notes})
    server = server_trace(tmp_path / "server", {
        "gpu": gpu, "server_metrics": metrics(vllm_scrapes(0, waiting=(0.0, 0.0, 0.0)), "client")})
    rep = merge_traces(client, server, tmp_path / "joined")
    joined = open_trace(tmp_path / "joined")
    assert joined.table("probe_notes").to_pylist() == [{"what": "a user's own table"}]
    assert joined.table("gpu").column("ts_ns").to_pylist() == [BASE]
    assert joined.rows("server_metrics") == open_trace(server).rows("server_metrics")
    left = [n for n in joined.meta["notes"] if "not kept" in n]
    assert len(left) == 2, joined.meta["notes"]
    assert any(n.startswith("gpu:") and "2 row(s) of the client trace" in n for n in left)
    assert any(n.startswith("server_metrics:") and "client clock" in n for n in left)
    assert rep.not_kept == left
    r = cli("merge", client, server, "-o", tmp_path / "joined2")
    assert r.code == 0 and sum("not kept" in line for line in r.err.splitlines()) == 2
    r = cli("merge", client, server, "-o", tmp_path / "joined3", "--json")
    assert json.loads(r.out)["not_kept"] == left
