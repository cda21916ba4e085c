"""The gate on a p99 says where the tail's time went, and which component moved it (module tail)."""

from __future__ import annotations

import pytest

from tests.analyzers.tail_scenarios import long_prompts, queue_bursts
from tracetool.report import analyse, build_report
from tracetool.report.budget import parse_budget


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    d = tmp_path_factory.mktemp("tail-gate")
    return {"queue": analyse(queue_bursts(d / "queue", n=600).path),
            "base": analyse(long_prompts(d / "base", n=600).path, role="baseline"),
            "slower": analyse(long_prompts(d / "slower", n=600, prefill_per_token=0.06).path)}


def test_an_absolute_p99_budget_says_where_the_tail_went(runs: dict) -> None:
    rep = build_report(runs["queue"], None, parse_budget({"p99_ttft_ms": 100, "p50_ttft_ms": 1000}, "b.toml"))
    check = next(c for c in rep.to_json()["checks"] if c["key"] == "p99_ttft_ms")
    assert check["status"] == "fail"
    assert "requests above p99 take" in check["tail"] and "queue" in check["tail"].split(":")[-1]
    assert check["message"].endswith(check["tail"])
    # a passing check, or one on a statistic without a tail group, carries no tail note
    assert all("tail" not in c for c in rep.to_json()["checks"] if c["key"] != "p99_ttft_ms")


def test_a_relative_p99_budget_names_the_component_that_moved(runs: dict) -> None:
    rep = build_report(runs["slower"], runs["base"], parse_budget({"p99_ttft_pct": 10}, "b.toml"))
    check = next(c for c in rep.to_json()["checks"] if c["key"] == "p99_ttft_pct")
    assert check["status"] in ("fail", "warn")
    assert check["tail"].startswith("the p99 tail moved most in prefill:"), check["tail"]
    if check["status"] == "fail":  # the line on stderr says it too
        assert any(line.startswith("FAIL p99_ttft_pct") and "moved most in prefill" in line
                   for line in rep.failing_lines())
