"""The gate on a p99 says where the tail's time went, and which component moved it (module tail).

On every tail scenario (tail_scenarios.CASES, noise included) ``tracetool report`` with a budget on the
tail its cause is found on says where that tail's time went, as ``analyze --json``'s tail object
splits it, and its findings name the same tail causes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.analyzers.tail_scenarios import CASES, Case, long_prompts, queue_bursts
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


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_budget_on_the_tail_says_where_each_scenarios_tail_went(case: Case, tail_runs: Any, cli: Any,
                                                                  tmp_path: Path) -> None:
    """A budget of half the percentile on the tail the scenario's finding is about (p99, or p95 where
    too few requests are above p99): the check fails, and says which components hold its extra time,
    the largest first, as the JSON's tail splits it."""
    doc = tail_runs.doc(case.name)
    cause = tail_runs.tail_findings(case.name)[case.finding]
    metric, level = cause["metric"], cause["level"]
    key = f"{level}_{metric}_ms"
    (tmp_path / "b.toml").write_text(f"{key} = {doc[f'{metric}_ms'][level] / 2:.3f}\n")
    r = cli("report", tail_runs.path(case.name), "--budget", tmp_path / "b.toml", "--format", "json")
    assert r.code == 1, r.err
    rep = json.loads(r.out)
    check = next(c for c in rep["checks"] if c["key"] == key)
    assert check["status"] == "fail"
    group = doc["tail"][metric][level]
    head, parts = check["tail"].split(": ", 1)
    unit = "gaps" if metric == "itl" else "requests"
    assert head.startswith(f"its {group['n']} {unit} above {level} take "), head
    first = parts.split(", ")[0].rsplit(" ", 2)[0]
    grew = {n: c["gap_share"] for n, c in group["components"].items()
            if c["measured"] and n != "unattributed" and c["gap_share"] >= 0.05}
    assert first == max(grew, key=lambda n: grew[n]), (parts, grew)
    assert f"FAIL {key}: {check['message']}" in r.err and check["message"].endswith(check["tail"])
    # the report's findings are the analysis': the scenario's cause, and no cause it did not build in
    named = {f["id"] for f in rep["findings"] if f["id"].startswith("tail-")}
    assert named == set(tail_runs.tail_findings(case.name)) and case.finding in named
    assert named - {case.finding} <= case.also
    if case.component is not None:
        assert first == case.component, check["tail"]
