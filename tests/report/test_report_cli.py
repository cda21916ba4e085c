"""`tracetool report` as a user runs it: whole traces, exit codes, files, one-line errors."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pyarrow as pa
import pytest
from report_inject import slow_itl
from report_mdcheck import tables
from report_synth import GOLDEN, Workload, run

from tests.conftest import run_tracetool
from tracetool.report import build_report


def test_a_trace_against_itself_passes(cli, trace_dirs) -> None:
    r = cli("report", trace_dirs["imported"], "--baseline", trace_dirs["imported"])
    assert r.code == 0, r.err
    assert r.out.startswith("## ✅ Latency report: `imported` vs baseline `imported`")
    assert "**Passed**: 8 checks, 8 passed" in r.out
    tables(r.out)


def test_an_injected_itl_regression_fails_with_the_failing_lines(cli, trace_dirs, tmp_path: Path) -> None:
    """ITL x 1.3 injected into the candidate's own trace files: ITL and TPOT fail, TTFT does not."""
    slowed = slow_itl(trace_dirs["candidate"], tmp_path / "slowed", 1.3)
    r = cli("report", slowed, "--baseline", trace_dirs["candidate"], "--format", "json")
    assert r.code == 1
    doc = json.loads(r.out)
    status = {c["key"]: c["status"] for c in doc["checks"]}
    assert status["p50_itl_pct"] == status["p95_itl_pct"] == status["p50_tpot_pct"] == "fail"
    assert status["p50_ttft_pct"] == status["p95_ttft_pct"] == "pass"
    fails = [ln for ln in r.err.splitlines() if ln.startswith("tracetool: FAIL ")]
    assert len(fails) == doc["summary"]["failed"] >= 3
    assert any(ln.startswith("tracetool: FAIL p50_itl_pct: p50 ITL is +30.0 % vs the baseline") for ln in fails)
    assert all("CI" in ln and "beyond the 5 % tolerance" in ln for ln in fails)


def test_an_imported_vllm_run_slowed_30_percent_fails(cli, trace_dirs, tmp_path: Path) -> None:
    slowed = slow_itl(trace_dirs["imported"], tmp_path / "vllm-slow", 1.3)
    r = cli("report", slowed, "--baseline", trace_dirs["imported"], "--format", "junit")
    assert r.code == 1
    root = ET.fromstring(r.out)
    failed = {c.get("name").split(":")[0] for c in root.iter("testcase") if c.find("failure") is not None}
    assert {"p50_itl_pct", "p95_itl_pct"} <= failed
    assert not {"p50_ttft_pct", "p95_ttft_pct"} & failed


def test_output_file_and_the_cli_bytes_equal_the_golden(cli, trace_dirs, tmp_path: Path, runs) -> None:
    out = tmp_path / "report.xml"
    r = cli("report", trace_dirs["regressed"], "--baseline", trace_dirs["baseline"],
            "--budget", GOLDEN / "regression-budget.toml", "--format", "junit", "-o", out)
    assert r.code == 1 and r.out == ""
    assert f"tracetool: wrote {out}: 12 checks, 6 failed, 0 warned, 0 skipped" in r.err
    assert out.read_text(encoding="utf-8") == (GOLDEN / "regression.xml").read_text(encoding="utf-8")


@pytest.mark.slow
def test_twenty_pairs_of_noisy_traces_are_not_flagged(cli, tmp_path: Path) -> None:
    """Twenty pairs of whole traces of one workload differing only by noise (run i against run
    i + 1 of 21 runs): the default gate passes every pair, through import-free real traces."""
    w = Workload.make(seed=11, requests=6)
    dirs = [run(w, seed=500 + i).write(tmp_path / f"run-{i:02d}") for i in range(21)]
    from tracetool.report import analyse

    analysed = [analyse(d) for d in dirs]
    failing = {}
    for i in range(20):
        rep = build_report(analysed[i + 1], analysed[i])
        if not rep.passed:
            failing[i] = rep.failing_lines()
    assert not failing, failing


def _write(directory: Path, tables_: dict[str, pa.Table]) -> Path:
    directory.mkdir(parents=True)
    (directory / "meta.json").write_text(json.dumps({"format": "tracetool", "version": 1}))
    for name, t in tables_.items():
        with pa.OSFile(str(directory / f"{name}.arrows"), "wb") as f, pa.ipc.new_stream(f, t.schema) as w:
            w.write_table(t)
    return directory


def _spans(rows: list[tuple[str, str, int, int, str]]) -> pa.Table:
    cols = list(zip(*rows, strict=True)) if rows else [[], [], [], [], []]
    return pa.table({"request_id": pa.array(cols[0], pa.string()), "name": pa.array(cols[1], pa.string()),
                     "start_ns": pa.array(cols[2], pa.int64()), "end_ns": pa.array(cols[3], pa.int64()),
                     "clock": pa.array(cols[4], pa.string())})


def one_error_line(r) -> str:
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.err, r.err
    return lines[0]


def test_bad_inputs_are_one_line_with_the_right_exit_code(cli, trace_dirs, tmp_path: Path) -> None:
    good = trace_dirs["candidate"]
    r = cli("report", good, "--baseline", GOLDEN / "regression-budget.toml")
    assert r.code == 3 and one_error_line(r).startswith("tracetool: error: baseline: ")
    assert "not a trace" in r.err
    r = cli("report", good, "--baseline", tmp_path / "nowhere")
    assert r.code == 3 and "baseline: " in one_error_line(r) and "no such file or directory" in r.err
    empty = _write(tmp_path / "empty", {"spans": _spans([])})
    r = cli("report", empty)
    assert r.code == 3 and "no requests to analyse" in one_error_line(r)
    unmeasurable = _write(tmp_path / "no-latency", {
        "spans": _spans([]), "requests": pa.table({"request_id": ["a"], "status": ["error"]})})
    r = cli("report", unmeasurable)
    assert r.code == 3 and one_error_line(r).startswith("tracetool: error: ")
    failed = _write(tmp_path / "all-failed", {  # streams that broke after a few tokens
        "spans": _spans([(r, "client.request", 0, 90, "client") for r in ("a", "b")]),
        "tokens": pa.table({"request_id": ["a", "a", "b"], "index": pa.array([0, 1, 0], pa.int32()),
                            "emit_ns": pa.array([50, 60, 55], pa.int64())}),
        "requests": pa.table({"request_id": ["a", "b"], "status": ["error", "error"]})})
    r = cli("report", failed)
    assert r.code == 3 and "all 2 requests failed: no latency to report" in one_error_line(r)
    r = cli("report", good, "--baseline", failed)
    assert r.code == 3 and one_error_line(r).startswith("tracetool: error: baseline: ")


def test_bad_budget_files_exit_3_naming_file_and_key(cli, trace_dirs, tmp_path: Path) -> None:
    b = tmp_path / "ci.toml"
    b.write_text("p95_tft_ms = 500\n")
    r = cli("report", trace_dirs["candidate"], "--budget", b)
    assert r.code == 3
    assert one_error_line(r) == (f"tracetool: error: {b}: unknown key 'p95_tft_ms' (did you mean 'p95_ttft_ms'?); "
                                 "budget keys are <stat>_<metric>_ms, <stat>_<metric>_pct (stat: mean, p50, p90, "
                                 "p95, p99; metric: ttft, itl, tpot, e2e), a component name, slo, goodput_min, "
                                 "slo_attainment_min, or the [report] table")
    b.write_text("[report]\nconfidence = 1.5\n")
    r = cli("report", trace_dirs["candidate"], "--budget", b)
    assert r.code == 3 and f"{b}: report.confidence = 1.5" in one_error_line(r)
    r = cli("report", trace_dirs["candidate"], "--budget", tmp_path / "missing.toml")
    assert r.code == 3 and "budget file not found" in one_error_line(r)


def test_relative_budget_without_baseline_is_exit_2(cli, trace_dirs, tmp_path: Path) -> None:
    b = tmp_path / "rel.toml"
    b.write_text("p50_itl_pct = 10\n")
    r = cli("report", trace_dirs["candidate"], "--budget", b)
    assert r.code == 2
    assert "p50_itl_pct compare with a baseline: pass --baseline TRACE" in one_error_line(r)
    r = cli("report", trace_dirs["candidate"], "--format", "html")
    assert r.code == 2


def test_no_traceback_in_a_real_process(tmp_path: Path) -> None:
    p = run_tracetool("report", tmp_path / "missing")
    assert p.returncode == 3 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


def test_without_baseline_or_budget_it_reports_and_passes(cli, trace_dirs) -> None:
    r = cli("report", trace_dirs["candidate"], "--claim", "network-rtt", "--format", "md")
    assert r.code == 0
    assert "**No checks** (no baseline and no budget)" in r.out
    assert "### Claims" in r.out and "misdiagnosis" in r.out
    heads = {t[0][0] for t in tables(r.out)}
    assert {"metric", "component", "claim"} <= heads



def test_a_sweep_directory_reports_its_levels_from_its_summary(cli, tmp_path: Path) -> None:
    """A probe sweep's output directory: the Markdown is the sweep's per-level summary from its
    ``sweep.json`` (levels, throughput, percentiles, goodput, SLO met, the best level), not one
    analysis of every level's requests pooled under the label ``all``; its JSON carries the summary."""
    from tests.conftest import REPO
    from tracetool import units
    from tracetool.report import fmt

    sweep = tmp_path / "sweep"
    levels = []
    for i, (rate, e2e, good, met) in enumerate([(2.0, 2960.0, 0.66, 1.0), (8.0, 4210.5, 1.5, 0.5)]):
        (sweep / f"{rate:g}").mkdir(parents=True)
        for f in (REPO / "sample_traces" / "chat").iterdir():
            (sweep / f"{rate:g}" / f.name).write_bytes(f.read_bytes())
        levels.append({"level": rate, "trace": str(sweep / f"{rate:g}"), "requests": 6, "ok": 6 - i, "failed": i,
                       "ttft_ms": {"p50": 112.0 + i, "p90": 150.0, "p99": 165.0 * (i + 1)},
                       "itl_ms": {"p50": 17.0, "p90": 33.0, "p99": 52.0},
                       "e2e_ms": {"p50": e2e, "p90": 3070.0, "p99": e2e + 120},
                       "request_throughput": 0.68 * (i + 1), "output_token_throughput": 1310.25 * (i + 1),
                       "shares": {"decode": 0.96, "prefill": 0.02}, "bottleneck": "decode", "client_bound": None,
                       "slo": {"targets": {"e2e_ms": 4000.0}, "requests": 6, "met_requests": round(6 * met),
                               "attainment": met, "goodput_rps": good, "met": met == 1.0}})
    summary = {"format": "tracetool-sweep", "version": 1, "axis": "rate", "levels": levels,
               "moved": "decode share 96 % at 2, 96 % at 8; decode stays the bottleneck", "best_level": 2.0}
    (sweep / "sweep.json").write_text(json.dumps(summary))
    r = cli("report", sweep, "-o", tmp_path / "s.md")
    assert r.code == 0, r.err
    md = (tmp_path / "s.md").read_text()
    assert md.startswith("## ✅ Sweep report: rate 2, 8\n") and "Latency report" not in md
    assert "`all`" not in md and "### Latency" not in md
    (per_level,) = tables(md)
    assert per_level[0] == ["rate", "ok", "req/s", "tok/s", "TTFT p50", "TTFT p99", "ITL p50", "e2e p50", "e2e p99",
                            "goodput req/s", "SLO met", "bottleneck"]
    assert per_level[1:] == [
        [f"{lv['level']:g}", f"{lv['ok']}/{lv['requests']}", units.number(lv["request_throughput"], 2),
         units.number(lv["output_token_throughput"], 1), fmt.ms(lv["ttft_ms"]["p50"]), fmt.ms(lv["ttft_ms"]["p99"]),
         fmt.ms(lv["itl_ms"]["p50"]), fmt.ms(lv["e2e_ms"]["p50"]), fmt.ms(lv["e2e_ms"]["p99"]),
         units.number(lv["slo"]["goodput_rps"], 2), fmt.share(lv["slo"]["attainment"]), "decode"] for lv in levels]
    assert per_level[2][3] == "2,620.5" and per_level[2][7] == "4.21 s" and per_level[2][10] == "50.0 %"
    assert "SLOs e2e_ms ≤ 4000: the highest rate that meets them is 2." in md
    assert "Where the time moved: decode share 96 % at 2, 96 % at 8; decode stays the bottleneck." in md
    j = cli("report", sweep, "--format", "json")
    assert j.code == 0, j.err
    assert json.loads(j.out)["sweep"] == summary
    # a trace that is not a sweep keeps its analysis' report, without the key
    plain = cli("report", REPO / "sample_traces" / "chat", "--format", "json")
    assert plain.code == 0 and "sweep" not in json.loads(plain.out)


def test_the_bootstrap_samples_are_read_only_for_a_comparison(monkeypatch, trace_dirs) -> None:
    """``samples_of`` (every token gap, in request order) is the bootstrap's input: a report with no
    baseline never reads it (on a 1M-token trace it cost a third of the analysis), one with a
    baseline reads each run's once, and what it reads is what ``samples_of`` gives."""
    from tracetool.report import analyse, build, samples_of
    from tracetool.report.budget import Budget

    calls: list[object] = []
    real = build.samples_of
    monkeypatch.setattr(build, "samples_of", lambda a: calls.append(a) or real(a))
    alone = analyse(trace_dirs["imported"])
    assert build_report(alone, None, Budget()).to_json()["summary"]["checks"] == 0
    assert calls == []
    base = analyse(trace_dirs["imported"], role="baseline")
    doc = build_report(alone, base, Budget()).to_json()
    assert doc["comparison"] and len(calls) == 2
    want = samples_of(alone.analysis)
    assert {m: (s.n, s.n_groups) for m, s in alone.samples.items()} == {
        m: (s.n, s.n_groups) for m, s in want.items()}
