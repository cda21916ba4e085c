"""``probe --metrics-url``: a real engine double exporting vLLM- and SGLang-format metrics from a real
prometheus_client registry, probed at concurrency 4 against its one slot; then what a bad /metrics does."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from analyzers import analyze
from tests.serving.engine_metrics_server import EngineDouble
from tracetool.reader import open_trace
from tracetool.serving.probe import ProbeConfig, run_probe


def _probe(engine: EngineDouble, out: Path, metrics_url: str = "auto", n: int = 8) -> list:
    res = run_probe(ProbeConfig(url=engine.url, n=n, concurrency=4, max_tokens=4, out=out, progress=False,
                                metrics_url=metrics_url, metrics_interval_s=0.1))
    return res.results


@pytest.mark.parametrize(("flavour", "openmetrics"), [("vllm", False), ("sglang", True)])
def test_engine_state_is_scraped_and_matches_the_truth(flavour: str, openmetrics: bool, tmp_path: Path) -> None:
    out = tmp_path / "trace"
    with EngineDouble(flavour, openmetrics=openmetrics) as engine:
        results = _probe(engine, out)
        truth_ms = statistics.mean(engine.queue_truth) * 1000
    assert all(r.ok for r in results) and len(results) == 8

    trace = open_trace(out)
    rows = trace.table("server_metrics")
    assert rows.num_rows > 0 and set(rows.column("clock").to_pylist()) == {"client"}
    assert trace.meta["server_metrics"]["clock"] == "client" and trace.meta["server_metrics"]["stopped"] is None

    doc = analyze(out).to_json()
    eng = doc["engine"]
    assert eng["source"] == flavour and eng["clock"] == "client" and eng["baseline"] is True
    assert eng["requests_waiting"]["max"] >= 1  # four in flight, one slot: the others wait
    assert eng["requests_running"]["max"] == 1
    assert eng["queue_time_ms"]["n"] == 8
    assert eng["queue_time_ms"]["mean"] == pytest.approx(truth_ms, rel=0.10)
    assert eng["queue_time_ms"]["p50"] <= eng["queue_time_ms"]["p95"]
    assert eng["prefix_cache_hit_rate"] == pytest.approx(0.25)
    # a client-only trace has no queue spans: the engine's window mean fills in, and says so
    q = doc["components"]["queue"]
    assert q["basis"] == "engine-metrics" and q["measured"] is False
    assert q["ms"] == pytest.approx(eng["queue_time_ms"]["mean"])
    assert q["series"] == eng["evidence"]["queue_time"]
    found = {f["id"]: f["detail"] for f in doc["findings"]}
    assert "engine-queueing" in found and eng["evidence"]["requests_waiting"] in found["engine-queueing"]
    assert "engine-no-queueing" not in found


def test_unknown_series_are_kept_and_queryable(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    with EngineDouble("vllm") as engine:
        _probe(engine, out, n=2)
    a = analyze(out)
    series = a.query("SELECT name, concept FROM engine_series").to_pylist()
    known = {s["name"] for s in series if s["concept"] is not None}
    assert "vllm:num_requests_waiting" in known
    # prometheus_client's own process/platform collectors are not in the test registry; the
    # histogram's _bucket series map, ttft's too; an unmapped name stays with concept null
    assert a.query("SELECT count(*) AS n FROM server_metrics WHERE name LIKE 'vllm:%'").column("n")[0].as_py() > 0


@pytest.mark.parametrize(("mode", "stops", "says"), [
    ("html", True, "HTML page"),
    ("404", True, "HTTP 404"),
    ("huge", True, "over 16 MiB"),
    ("hang", False, "failed"),
    ("malformed", False, "1 malformed line(s) skipped"),
])
def test_a_bad_metrics_endpoint_costs_one_warning_and_never_the_probe(mode: str, stops: bool, says: str,
                                                                       tmp_path: Path, capfd) -> None:
    out = tmp_path / "trace"
    with EngineDouble("vllm", metrics=mode) as engine:
        results = _probe(engine, out)
    err = capfd.readouterr().err
    assert all(r.ok for r in results) and len(results) == 8  # the probe's own results, every one
    lines = [ln for ln in err.splitlines() if "metrics" in ln]
    assert len(lines) == 1, err
    assert says in lines[0] and "Traceback" not in err
    trace = open_trace(out)
    assert trace.rows("requests") == 8
    info = trace.meta["server_metrics"]
    assert (info["stopped"] is not None) == stops
    if mode == "malformed":  # the good lines are kept
        assert trace.rows("server_metrics") > 0
        assert analyze(out).to_json()["engine"]["requests_waiting"]["max"] >= 1
    else:
        assert trace.rows("server_metrics") == 0


def test_metrics_url_needs_an_output(cli) -> None:
    r = cli("probe", "http://127.0.0.1:9/v1", "--metrics-url", "auto", "-q")
    assert r.code == 2 and "--metrics-url needs -o" in r.err


def test_probe_cli_scrapes_and_validate_accepts_the_table(cli, tmp_path: Path) -> None:
    out = tmp_path / "trace"
    with EngineDouble("vllm") as engine:
        r = cli("probe", engine.url, "-n", "4", "--concurrency", "4", "--max-tokens", "3", "-q", "-o", out,
                "--metrics-url", engine.url.removesuffix("/v1") + "/metrics", "--metrics-interval", "0.1")
    assert r.code == 0, r.err
    assert "engine metrics: " in r.err and "samples in server_metrics" in r.err
    v = cli("validate", out, "--json")
    assert v.code == 0, v.err
    assert "server_metrics" in json.dumps(json.loads(v.out))


def test_serve_scrapes_on_the_server_clock(tmp_path: Path) -> None:
    """tracetool serve --metrics-url: an engine's metrics scraped by the recording process, their
    window the server.request spans."""
    from tests.serving.conftest import wait_ready
    from tracetool.serving.demo import server_process

    trace = tmp_path / "server"
    with EngineDouble("vllm") as engine:
        metrics = engine.url.removesuffix("/v1") + "/metrics"
        with server_process(trace, "--threads", "1", "--metrics-url", metrics, "--metrics-interval", "0.1") as (url, _):
            wait_ready(url)
            run_probe(ProbeConfig(url=url, n=2, concurrency=2, max_tokens=3, progress=False))
    t = open_trace(trace)
    assert t.rows("server_metrics") > 0
    assert set(t.table("server_metrics").column("clock").to_pylist()) == {"server"}
    assert t.meta["server_metrics"]["url"] == metrics
    (w,) = analyze(trace).query("SELECT * FROM engine_window").to_pylist()
    assert w["clock"] == "server" and w["basis"] == "requests"


def test_record_scrapes_while_the_program_runs(tmp_path: Path, cli) -> None:
    out = tmp_path / "rec"
    with EngineDouble("sglang") as engine:
        r = cli("record", "-o", out, "--metrics-url", engine.url.removesuffix("/v1") + "/metrics", "--",
                "python", "-c", "pass")
    assert r.code == 0, r.err
    t = open_trace(out)
    assert t.rows("server_metrics") > 0  # at least the scrape when the program ended
    assert "sglang:num_queue_reqs" in set(t.table("server_metrics").column("name").to_pylist())
    assert t.meta["server_metrics"]["clock"] == "server"
