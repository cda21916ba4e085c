"""The HTML page in a real headless browser (Debian's chromium over the DevTools protocol).

Each page loads with no request but its own file and no console error (its CSP would log any
fetch it blocked), has every section, drawn where the trace has the data and otherwise with a
one-line reason, and every number it prints equals the ``--json`` document of the same command
(``analyze``, ``report``, ``diff``, the sweep's ``sweep.json``), read back from the page's text.
Every sample trace (each directory of sample_traces/ with a meta.json) gives both an ``analyze``
and a ``report`` page. Skipped with the reason where no browser is installed; marked ``slow``
(one browser for the module).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from html_browser import Browser, find_chromium
from html_fixtures import SAMPLE_NAMES, SAMPLES, check_numbers, engine_trace

pytest.importorskip("matplotlib", reason="the html extra (matplotlib) is not installed")
_EXE, _WHY = find_chromium()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_EXE is None, reason=_WHY)]

ANALYSIS_SECTIONS = ["verdict", "waterfalls", "distributions", "decode", "engine"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with Browser() as b:
        yield b


def _clean_load(b: Browser, page: Path, dark: bool = False) -> dict[str, Any]:
    seen = b.open(page, dark=dark)
    assert seen.requests == [page.resolve().as_uri()], f"the page fetched something: {seen.requests}"
    assert seen.errors == [], seen.errors
    assert seen.page["scripts"] == 0
    # nothing laid out past the window's right edge (a wide table scrolls in its own box)
    assert seen.page["scrollWidth"] <= seen.page["viewportWidth"], (seen.page["scrollWidth"], page.name)
    return seen.page


def _sections(page: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in page["sections"]}


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_a_sample_traces_pages_load_clean_and_say_what_analyze_json_says(name: str, browser: Browser, cli: Any,
                                                                         tmp_path: Path) -> None:
    """``analyze --html`` and ``report --html -o X.md`` of every sample trace: the report's page is
    its checks (none: no baseline, no budget) and then the same analysis, number for number."""
    page = tmp_path / f"{name}.html"
    r = cli("analyze", SAMPLES / name, "--claim", "network-rtt", "--json", "--html", page)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    seen = _clean_load(browser, page)
    sections = _sections(seen)
    assert list(sections) == ANALYSIS_SECTIONS
    _drawn_as_a_sample_is(sections)
    checked = check_numbers(seen["numbers"], doc)
    keys = {x["key"] for x in seen["numbers"]}
    assert {"e2e_ms.p50", "itl_ms.p99", "components.decode.share", "claims.0.share"} <= keys
    assert checked >= 40

    out = tmp_path / "report"
    out.mkdir()
    rep = cli("report", SAMPLES / name, "--claim", "network-rtt", "--html", out / "page.html", "-o", out / "report.md")
    assert rep.code == 0, rep.err
    rseen = _clean_load(browser, out / "page.html")
    rsections = _sections(rseen)
    assert list(rsections) == ["checks", *ANALYSIS_SECTIONS]
    assert rsections["checks"]["absent"] and "no checks: no baseline and no budget" in rsections["checks"]["reason"]
    _drawn_as_a_sample_is(rsections)
    summary = [x for x in rseen["numbers"] if x["key"].startswith("summary.")]
    analysis = [x for x in rseen["numbers"] if x not in summary]
    assert {x["key"] for x in analysis} == keys  # the same analysis, every number of it
    check_numbers(analysis, doc)
    # the report's own numbers, as its document gave them to the line -o prints on stderr
    said = re.search(r"wrote \S+: (\d+) checks, (\d+) failed", rep.err)
    assert said, rep.err
    check_numbers(summary, {"summary": {"checks": int(said.group(1)), "failed": int(said.group(2))}})
    assert {x["key"] for x in summary} == {"summary.checks", "summary.failed"}
    # the Markdown links the page and shows each of its figures, written beside it
    md = (out / "report.md").read_text()
    assert "### Pictures" in md and "](page.html)" in md
    images = re.findall(r"!\[([^\]]+)\]\(([^)]+)\)", md)
    assert len(images) == sum(s["svgs"] for s in rsections.values())
    assert all((out / path).is_file() for _, path in images)


def _drawn_as_a_sample_is(sections: dict[str, dict[str, Any]]) -> None:
    """A sample trace has tokens and no engine metrics: four sections drawn, the engine's said absent."""
    for sid in ("verdict", "waterfalls", "distributions", "decode"):
        assert not sections[sid]["absent"] and sections[sid]["svgs"] >= 1, sid
        assert all(w > 300 for w in sections[sid]["svgWidths"]), f"{sid}: a figure is not laid out"
    eng = sections["engine"]
    assert eng["absent"] and eng["svgs"] == 0 and "no server_metrics table" in eng["reason"]


def test_an_engine_trace_draws_the_engine_and_its_numbers_are_the_jsons(browser: Browser, cli: Any,
                                                                         tmp_path: Path) -> None:
    trace = engine_trace(tmp_path / "engine")
    page = tmp_path / "engine.html"
    r = cli("analyze", trace, "--json", "--html", page)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["engine"]["preemptions"] == 2
    seen = _clean_load(browser, page)
    eng = _sections(seen)["engine"]
    assert not eng["absent"] and eng["svgs"] == 1
    keys = {x["key"] for x in seen["numbers"]}
    assert {"engine.requests_waiting.max", "engine.kv_cache_usage.max", "engine.preemptions"} <= keys
    check_numbers(seen["numbers"], doc)


def test_a_report_page_with_a_baseline_shows_its_checks(browser: Browser, cli: Any, trace_dirs: dict[str, Path],
                                                        tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    r = cli("report", trace_dirs["regressed"], "--baseline", trace_dirs["baseline"], "--format", "json",
            "--html", page, "-o", tmp_path / "report.json")
    assert r.code == 1, r.err  # ITL +30 %: the gate fails, and the page is still written
    doc = json.loads((tmp_path / "report.json").read_text())
    seen = _clean_load(browser, page)
    sections = _sections(seen)
    assert list(sections) == ["checks", *ANALYSIS_SECTIONS] and not sections["checks"]["absent"]
    report_numbers = [x for x in seen["numbers"] if x["key"].split(".")[0] in ("checks", "comparison", "summary")]
    analysis_numbers = [x for x in seen["numbers"] if x not in report_numbers]
    assert report_numbers and analysis_numbers
    for x in report_numbers:
        if x["key"].startswith("checks."):  # a check's value is shown with its interval: compare its start
            x = {**x, "text": x["text"].split(" (")[0]}
        check_numbers([x], doc)
    adoc = json.loads(cli("analyze", trace_dirs["regressed"], "--json").out)
    check_numbers(analysis_numbers, adoc)


def test_a_diff_page_puts_the_moved_component_first(browser: Browser, cli: Any, trace_dirs: dict[str, Path],
                                                    tmp_path: Path) -> None:
    page = tmp_path / "diff.html"
    r = cli("diff", trace_dirs["baseline"], trace_dirs["regressed"], "--json", "--html", page)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    seen = _clean_load(browser, page)
    assert [s["id"] for s in seen["sections"]] == ["diff", "diff-latency"]
    assert all(not s["absent"] and s["svgs"] == 1 for s in seen["sections"])
    check_numbers(seen["numbers"], doc)
    first = next(x["key"] for x in seen["numbers"] if x["key"].startswith("components."))
    top = next(i for i, c in enumerate(doc["components"]) if c["component"] == doc["top"])
    assert first.startswith(f"components.{top}."), "the moved component is not the first row"


def test_a_sweep_directory_gives_the_sweep_page(browser: Browser, cli: Any, tmp_path: Path) -> None:
    from tests.serving.recording_double import RecordingServer, UvicornThread

    out = tmp_path / "sweep"
    with UvicornThread(RecordingServer(service_s=0.02).app()) as srv:
        r = cli("probe", srv.url, "--rate", "5,40", "--burstiness", "inf", "--concurrency", 1, "-n", 5,
                "--slo", "e2e_ms=150", "-q", "--json", "-o", out)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert json.loads((out / "sweep.json").read_text()) == doc
    page = tmp_path / "sweep.html"
    rep = cli("report", out, "--html", page, "-o", tmp_path / "sweep.md")
    assert rep.code == 0, rep.err
    seen = _clean_load(browser, page)
    assert seen["kind"] == "sweep" and [s["id"] for s in seen["sections"]] == ["sweep"]
    assert seen["sections"][0]["svgs"] == 2
    # the 12-column per-level table fits the 1280 px window: no column (goodput, SLO met) off-screen,
    # neither past the page's edge nor inside the table's own scrolling box
    assert seen["viewportWidth"] == browser.width
    assert seen["scrollWidth"] <= seen["viewportWidth"], (seen["scrollWidth"], seen["viewportWidth"])
    assert seen["sections"][0]["tablesFit"]
    check_numbers(seen["numbers"], doc)
    assert {"levels.1.ttft_ms.p99", "levels.0.slo.goodput_rps", "best_level"} <= {x["key"] for x in seen["numbers"]}


def test_the_page_follows_the_readers_dark_preference(browser: Browser, cli: Any, tmp_path: Path) -> None:
    page = tmp_path / "chat.html"
    assert cli("analyze", SAMPLES / "chat", "--html", page).code == 0
    light = _clean_load(browser, page)["fg"]
    dark = _clean_load(browser, page, dark=True)["fg"]
    assert light != dark
    # text is light on dark: the sum of its channels is high
    assert sum(int(c) for c in dark[4:-1].split(",")) > 3 * 180 > sum(int(c) for c in light[4:-1].split(","))
