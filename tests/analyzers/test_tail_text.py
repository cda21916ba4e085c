"""``tracetool analyze TRACE`` in text explains the tail of every tail scenario as ``--json`` does.

For each scenario of tail_scenarios.CASES the text's tail section holds the sentence ``--json`` gives for
each metric, the explained tail's extra time is first in the component the scenario built in, and the
findings name the scenario's cause and no other (noise: a tail of noise, no cause).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from tail_scenarios import CASES, Case

from tests.tail_runs import METRIC_KEYS

HEADER = "the tail (above p99, else p95, against the typical p40-p60 requests; share of the gap)"


def _section(out: str, header: str) -> list[str]:
    """The lines after ``header`` up to the next blank line."""
    lines = out.splitlines()
    start = lines.index(header) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def _findings(out: str) -> dict[str, tuple[str, str]]:
    """The findings the text prints: id -> (title, detail)."""
    lines = _section(out, "findings")
    found = {}
    for head, detail in zip(lines[::2], lines[1::2], strict=True):
        m = re.fullmatch(r"  [!·-] ([a-z0-9-]+): (.*)", head)
        assert m, head
        found[m.group(1)] = (m.group(2), detail.strip())
    return found


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_text_explains_each_scenarios_tail(case: Case, tail_runs: Any, cli: Any) -> None:
    doc = tail_runs.doc(case.name)
    r = cli("analyze", tail_runs.path(case.name))
    assert r.code == 0, r.err
    section = _section(r.out, HEADER)
    sentences = [doc["tail"][m]["sentence"] for m in ("ttft", "e2e", "tpot", "itl") if doc["tail"][m]]
    assert section == [f"  {s}" for s in sentences]  # the JSON's words, every metric, in its order

    # the findings name the same tail causes as --json, with the same evidence, and the scenario's is one
    text = {k: v for k, v in _findings(r.out).items() if k.startswith("tail-")}
    named = tail_runs.tail_findings(case.name)
    assert {k: v[1] for k, v in text.items()} == {k: f["detail"] for k, f in named.items()}
    assert case.finding in text
    cause = named[case.finding]
    word = next(w for w, m in METRIC_KEYS.items() if m == cause["metric"])
    line = next(s for s in section if s.startswith(f"  {cause['level']} {word} ("))
    if case.component is None:
        assert set(text) == {"tail-noise"}, text
        requests = [s for s in section if not s.startswith(("  p99 ITL", "  p95 ITL"))]
        assert len(requests) == 3 and all(s.endswith("a tail of noise") for s in requests), requests
        assert "no cause named" in cause["detail"]
        return
    assert set(text) - {case.finding} <= case.also, text  # no cause the scenario did not build in
    # the tail the finding is about: its extra time is first in the scenario's component, as the JSON says
    assert doc["tail"][cause["metric"]]["top_component"] == case.component
    assert line.split("): ", 1)[1].startswith(f"{case.component} "), line


@pytest.mark.parametrize("name", ["queue_bursts", "interference", "preempt"])
def test_queueing_is_called_bursts_only_when_the_arrivals_before_separate_the_tail(name: str, tail_runs: Any) -> None:
    """Poisson arrivals at an engine near capacity queue the requests that arrive into a burst; the batched
    runs arrive faster than the engine serves, so their queue grows through the run and the last arrivals
    wait longest. Both are queueing, with different levers (smoothing the arrivals helps only bursts): the
    finding says bursts when the arrivals in the second before separate its tail, and says it is not
    bursts otherwise."""
    f = tail_runs.tail_findings(name)["tail-queue-bursts"]
    group = tail_runs.doc(name)["tail"][f["metric"]][f["level"]]
    bursty = any(x["feature"] == "arrivals_1s" and x["separates"] and x["cliffs_delta"] > 0 for x in group["features"])
    assert ("The tail arrived in bursts" in f["detail"]) == bursty, f["detail"]
    assert ("not in bursts" in f["detail"]) == (not bursty)
    assert ("smoother arrivals move" in f["detail"]) == bursty
    if name == "queue_bursts":
        assert bursty
