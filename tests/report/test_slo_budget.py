"""SLOs in analyze, report and the budget file: goodput and attainment, gated.

The trace is a real probe run against a uvicorn server (tests/serving/recording_double.py); the
SLOs are set far above or below what any request can take, so the verdicts cannot flap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.serving.recording_double import RecordingServer, UvicornThread


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tracetool.cli import main

    out = tmp_path_factory.mktemp("slo") / "t"
    with UvicornThread(RecordingServer(tokens=3).app()) as s:
        assert main(["probe", s.url, "-n", 5, "--concurrency", 1, "-q", "-o", str(out)]) == 0
    return out


def test_analyze_slo_object(probed: Path, cli: Any) -> None:
    r = cli("analyze", probed, "--json", "--slo", "ttft_ms=60000,e2e_ms=60000")
    assert r.code == 0, r.err
    slo = json.loads(r.out)["slo"]
    assert (slo["requests"], slo["met_requests"], slo["attainment"], slo["met"]) == (5, 5, 1.0, True)
    assert slo["goodput_rps"] > 0 and slo["targets"] == {"ttft_ms": 60000.0, "e2e_ms": 60000.0}
    none = json.loads(cli("analyze", probed, "--json", "--slo", "e2e_ms=0.001").out)["slo"]
    assert (none["met_requests"], none["attainment"], none["goodput_rps"], none["met"]) == (0, 0.0, 0.0, False)
    assert "slo" not in json.loads(cli("analyze", probed, "--json").out)
    text = cli("analyze", probed, "--slo", "e2e_ms=0.001")
    assert "0 of 5 requests met it" in text.out and "NOT met" in text.out


def test_budget_goodput_and_attainment_pass_and_fail(probed: Path, cli: Any, tmp_path: Path) -> None:
    ok = tmp_path / "ok.toml"
    ok.write_text('slo = "e2e_ms=60000"\ngoodput_min = 0.001\nslo_attainment_min = 0.9\n')
    r = cli("report", probed, "--budget", ok, "--format", "json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    checks = {c["key"]: c for c in doc["checks"]}
    assert checks["goodput_min"]["status"] == checks["slo_attainment_min"]["status"] == "pass"
    assert checks["slo_attainment_min"]["value"] == 1.0 and doc["slo"]["met_requests"] == 5
    md = cli("report", probed, "--budget", ok)
    assert "### SLOs" in md.out and "5 of 5 requests met them" in md.out
    # --slo on the command line wins over the budget's
    bad = cli("report", probed, "--budget", ok, "--slo", "e2e_ms=0.001", "--format", "json")
    assert bad.code == 1
    failed = {c["key"]: c for c in json.loads(bad.out)["checks"] if c["status"] == "fail"}
    assert set(failed) == {"goodput_min", "slo_attainment_min"}
    assert "SLO attainment 0.0 %" in bad.err or "SLO attainment 0 %" in bad.err, bad.err


def test_slo_budgets_without_slos_are_skipped(probed: Path, cli: Any, tmp_path: Path) -> None:
    b = tmp_path / "b.toml"
    b.write_text("slo_attainment_min = 0.9\n")
    r = cli("report", probed, "--budget", b, "--format", "json")
    assert r.code == 0, r.err
    (check,) = [c for c in json.loads(r.out)["checks"] if c["key"] == "slo_attainment_min"]
    assert check["status"] == "skip" and "no SLOs given" in check["message"]


@pytest.mark.parametrize(("content", "said"), [
    ('slo = "ttft=5"\n', "unknown key 'ttft'"),
    ("slo = 5\n", "expected a string"),
    ("slo_attainment_min = 1.5\n", "a share in [0, 1]"),
    ("goodput_minimum = 1\n", "did you mean 'goodput_min'"),
])
def test_bad_slo_budget_lines_exit_3_naming_the_file(content: str, said: str, probed: Path, cli: Any,
                                                     tmp_path: Path) -> None:
    b = tmp_path / "bad.toml"
    b.write_text(content)
    r = cli("report", probed, "--budget", b)
    assert r.code == 3 and said in r.err and str(b) in r.err, r.err


def test_unknown_slo_key_on_the_command_line_exits_2(probed: Path, cli: Any) -> None:
    for cmd in ("analyze", "report"):
        r = cli(cmd, probed, "--slo", "latency_ms=5")
        assert r.code == 2 and "unknown key 'latency_ms'" in r.err, (cmd, r.err)
