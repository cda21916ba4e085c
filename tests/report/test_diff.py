"""``tracetool diff A B``: which components moved, by how much, with the gate's intervals.

A and B are the same workload (30 requests, inline traces from tests/analyzers/analyzer_scenarios.py)
except that B waits ~190 ms longer in the server's queue: the diff must name queue as ``top``, give
its change per request with an interval that excludes 0, and say it in the headline. On the tail
scenarios (tests/analyzers/tail_scenarios.py) the diff names the component that moved the tail.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.analyzers.analyzer_scenarios import Req, scenario
from tracetool.report import fmt
from tracetool.report.diff import diff
from tracetool.tui.diff_app import DiffApp


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("diff")
    a = scenario(d / "a", [Req(start=i * 2000, network=1.0, queue=10.0 + i % 3, prefill=50.0, output=20)
                           for i in range(30)])
    b = scenario(d / "b", [Req(start=i * 2000, network=1.0, queue=200.0 + i % 3, prefill=50.0, output=20)
                           for i in range(30)])
    return a, b


def test_the_component_that_moved_is_top_with_its_interval(pair: tuple[Path, Path]) -> None:
    doc = diff(*pair)
    assert (doc["format"], doc["version"], doc["top"]) == ("tracetool-diff", 1, "queue")
    q = next(c for c in doc["components"] if c["component"] == "queue")
    assert q["delta_ms"] == pytest.approx(190.0, abs=0.01)
    assert q["significant"] and q["ci_low_ms"] <= 190.0 <= q["ci_high_ms"] and q["ci_low_ms"] > 150
    assert q["delta_share"] > 0
    decode = next(c for c in doc["components"] if c["component"] == "decode")
    assert decode["delta_ms"] == pytest.approx(0.0, abs=1e-6) and not decode["significant"]
    ttft = next(x for x in doc["latency"] if x["metric"] == "ttft" and x["stat"] == "p95")
    assert ttft["delta_pct"] > 100 and ttft["significant"]
    assert doc["headline"].startswith("+") and "TTFT, all in queue (+190.0 ms per request)" in doc["headline"]


def test_cli_text_json_and_bad_input(pair: tuple[Path, Path], cli: Any, tmp_path: Path) -> None:
    r = cli("diff", *pair, "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["top"] == "queue"
    t = cli("diff", *pair)
    assert t.code == 0 and "all in queue (+190.0 ms per request)" in t.out and "<- top" in t.out
    bad = cli("diff", tmp_path / "nope", pair[1])
    assert bad.code == 3 and bad.err.count("\n") == 1 and "A: " in bad.err, bad.err


def test_the_headline_writes_changes_with_the_one_ms_formatter() -> None:
    """A change of seconds reads as the other surfaces write it (``-2.29 s``), never ``-2.29e+03 ms``:
    the headline is the diff page's lead and the first line ``tracetool diff`` prints."""
    from tracetool.report.diff import headline
    from tracetool.units import ms

    lat = [{"metric": "e2e", "stat": "p95", "delta_pct": -61.0, "significant": True}]
    comps = [{"component": "queue", "delta_ms": -2291.4}, {"component": "decode", "delta_ms": -3.2}]
    tail = [{"metric": "e2e", "stat": "p95", "top": "queue",
             "components": [{"component": "queue", "delta_ms": -12345.6}]}]
    said = headline({"latency": lat, "components": comps, "top": "queue", "tail": tail})
    assert said == ("-61 % p95 e2e, all in queue (-2.29 s per request); its tail moved most in queue "
                    "(-12.35 s per tail request)")
    assert "e+" not in said and ms(-2291.4, sign=True) in said
    small = headline({"latency": lat, "components": [{"component": "queue", "delta_ms": 4.5}], "top": "queue"})
    assert small.endswith("all in queue (+4.50 ms per request)")


def test_the_headline_says_when_another_component_moved_the_other_way() -> None:
    """Decode 2.29 s faster and queue 2.03 s slower: the signed sum is -0.3 s, and 'all in decode' (its
    share of that sum, 7.7) hid the queue. Shares are of the movement, and the offset is named."""
    from tracetool.report.diff import headline

    lat = [{"metric": "ttft", "stat": "p95", "delta_pct": 2374.0, "significant": True}]
    comps = [{"component": "queue", "delta_ms": 2027.98}, {"component": "decode", "delta_ms": -2289.15},
             {"component": "prefill", "delta_ms": -17.5}, {"component": "network", "delta_ms": None}]
    said = headline({"latency": lat, "components": comps, "top": "decode"})
    assert said == ("+2374 % p95 TTFT, mostly in decode (-2.29 s per request), offset by queue (+2.03 s)")
    comps[0]["delta_ms"] = 200.0  # a small offset is not named
    assert headline({"latency": lat, "components": comps, "top": "decode"}).endswith(
        "all in decode (-2.29 s per request)")


def test_the_tui_opens_a_diff(pair: tuple[Path, Path]) -> None:
    doc = diff(*pair)

    async def go() -> tuple[str, int, int]:
        app = DiffApp(doc)
        async with app.run_test() as pilot:
            await pilot.pause()
            head = str(app.query_one("#headline").render())
            return head, app.query_one("#latency").row_count, app.query_one("#components").row_count

    head, n_lat, n_comp = asyncio.run(go())
    assert doc["headline"] in head
    assert n_lat == len(doc["latency"]) == 12 and n_comp == len(doc["components"])


def test_the_tui_and_the_text_diff_print_the_same_cells(capsys: pytest.CaptureFixture[str]) -> None:
    """0.125 ms is 0.13 on both (the TUI once rounded the binary double to 0.12), and a missing value
    is the one not-measured mark on both."""
    from tracetool.glyphs import NOT_MEASURED
    from tracetool.report.diff import print_diff

    doc = {"a": {"label": "a", "requests": 1}, "b": {"label": "b", "requests": 1}, "headline": "h", "top": None,
           "latency": [{"stat": "p50", "metric": "ttft", "a_ms": 0.125, "b_ms": None, "delta_pct": None,
                        "ci_low_pct": None, "ci_high_pct": None, "significant": False}],
           "components": [{"component": "queue", "a_ms": 2.675, "b_ms": 1.0, "delta_ms": -1.675,
                           "ci_low_ms": -2.005, "ci_high_ms": 0.125, "a_share": None, "b_share": 0.5}]}
    print_diff(doc)
    lines = capsys.readouterr().out.splitlines()
    comp = lines[7].split()  # queue 2.68 1.00 -1.68 -2.01 .. +0.13 – -> 50.0 %
    text = [lines[4].split()[2:5], [*comp[1:5], comp[6]]]

    async def go() -> list[list[str]]:
        from textual.widgets import DataTable

        app = DiffApp(doc)
        async with app.run_test() as pilot:
            await pilot.pause()
            lat = app.query_one("#latency", DataTable).get_row_at(0)
            comps = app.query_one("#components", DataTable).get_row_at(0)
            return [[str(x) for x in lat[1:4]], [str(x) for x in comps[1:4]] + str(comps[4]).split(" … ")]

    assert asyncio.run(go()) == text == [["0.13", NOT_MEASURED, NOT_MEASURED],
                                         ["2.68", "1.00", "-1.68", "-2.01", "+0.13"]]


def test_the_diff_says_which_component_moved_the_tail(tmp_path: Path) -> None:
    """B's prefill is twice as slow per prompt token: its p99 TTFT (the 30k-token prompts) moves, and the
    diff's tail names prefill with the change the generator made to those requests."""
    from tests.analyzers.tail_scenarios import long_prompts

    a = long_prompts(tmp_path / "a", n=600)
    b = long_prompts(tmp_path / "b", n=600, prefill_per_token=0.06)
    doc = diff(a.path, b.path)
    t = next(x for x in doc["tail"] if (x["metric"], x["stat"]) == ("ttft", "p99"))
    assert t["top"] == "prefill"
    means = []
    for w in (a, b):  # the requests above numpy's p99 of the TTFTs written, and their mean prefill
        reqs = list(w.reqs.values())
        ttft = np.array([r.network + r.queue + r.tokenize + r.prefill for r in reqs])
        tail = [r for r, x in zip(reqs, ttft, strict=True) if x > np.percentile(ttft, 99)]
        assert all(r.prompt == 30_000 for r in tail)  # the tail is long prompts in both runs
        means.append((len(tail), float(np.mean([r.prefill for r in tail]))))
    assert (t["a_requests"], t["b_requests"]) == (means[0][0], means[1][0])
    top = t["components"][0]
    assert top["a_ms"] == pytest.approx(means[0][1], abs=0.01)
    assert top["delta_ms"] == pytest.approx(means[1][1] - means[0][1], abs=0.01)
    p99 = next(x for x in doc["latency"] if (x["metric"], x["stat"]) == ("ttft", "p99"))
    assert p99["delta_pct"] > 50  # (6 requests above p99: its interval is wide)
    assert "its tail moved most in prefill" in doc["headline"]


@pytest.mark.parametrize(("a", "b"), [("noise", "queue_bursts"), ("noise", "long_prompts"),
                                      ("interference_short", "interference")])
def test_the_diff_names_the_component_that_moved_each_scenarios_tail(a: str, b: str, tail_runs: Any,
                                                                    cli: Any) -> None:
    """From a trace without the cause (noise; for the batched engine, its prompts a quarter as long) to a
    scenario's: ``tracetool diff``'s tail table names the scenario's component first, for the tail its
    finding is about, with each run's mean per tail request as ``analyze --json`` gives it."""
    from tests.analyzers.tail_scenarios import CASES

    case = next(c for c in CASES if c.name == b)
    cause = tail_runs.tail_findings(b)[case.finding]
    metric, stat = cause["metric"], cause["level"]
    r = cli("diff", tail_runs.path(a), tail_runs.path(b))
    assert r.code == 0, r.err
    table = r.out.split("\ntail ", 1)[1].splitlines()
    name = f"{stat} {fmt.METRIC_NAMES[metric]}"
    row = next(line for line in table if line.startswith(name)).split()
    counts, component, a_ms, b_ms, change = row[2:]
    assert component == case.component, row
    groups = [tail_runs.doc(x)["tail"][metric][stat] for x in (a, b)]
    assert counts == f"{groups[0]['n']}/{groups[1]['n']}"
    means = [g["components"][component]["tail_ms"] for g in groups]
    assert [float(x.replace(",", "")) for x in (a_ms, b_ms)] == pytest.approx(means, abs=0.006)
    assert float(change) == pytest.approx(means[1] - means[0], abs=0.006) and float(change) > 0
