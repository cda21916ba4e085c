"""The report formats CI renders keep outside text inert: Markdown, JUnit XML and JSON.

The document is the regression golden's (tests/report/golden/regression.json) with the payload
in every text field a trace, a budget or a command line can reach (labels, the imported
source, the budget path, the headline, checks, findings, claims). Markdown is rendered to HTML
by markdown-it-py (CommonMark with GFM tables), as a CI page would: no image, link, raw HTML
or decoded bidi entity may come out of it, and every table keeps its shape. JUnit must parse
as XML. JSON must give back the exact strings.
"""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt

from tests.fuzz.fuzzlib import run_cli
from tests.report.report_mdcheck import tables
from tests.untrusted.evil import PAYLOAD, check_output
from tracetool.report import render

GOLDEN = Path(__file__).resolve().parents[1] / "report" / "golden" / "regression.json"


def _doc() -> dict[str, Any]:
    doc = json.loads(GOLDEN.read_text())
    evil = copy.deepcopy(doc)
    p = PAYLOAD
    evil["trace"]["label"] = f"run {p}"
    evil["trace"]["source"] = f"file {p}"
    evil["baseline"]["label"] = f"base {p}"
    evil["settings"]["budget"] = f"budget {p}.toml"
    evil["headline"] = f"# {p} headline"
    for c in evil["checks"]:
        c.update(title=f"{c['title']} {p}", message=f"{c['message']} {p}", key=f"{c['key']}{p}")
    for f in evil["findings"]:
        f.update(title=f"{f['title']} {p}", id=f"{f['id']}{p}", detail=f"{f['detail']} {p}")
    evil["claims"] = [{"claim": f"claim {p}", "verdict": "misdiagnosis", "share": 0.5, "detail": f"detail {p}"}]
    for c in evil["comparison"]:
        c["note"], c["change"] = f"note {p}", None
    return evil


def _html(md: str) -> str:
    return MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(md)


def test_markdown_is_inert_on_a_ci_page() -> None:
    doc = _doc()
    md = render(doc, "md")
    check_output(md, where="report md")
    clean = tables(render(json.loads(GOLDEN.read_text()), "md"))
    shapes = [(len(t), len(t[0])) for t in tables(md)]
    assert shapes[:len(clean)] == [(len(t), len(t[0])) for t in clean], "every table keeps its rows and columns"
    html = _html(md)
    for active in ("<img", "<a ", "<script", "\u202e", "\x1b", "<h1"):
        assert active not in html, f"{active!r} came out of the page: {html[:2000]}"
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "[link](https://evil.example/)" in html
    assert "\\x1b]0;pwned\\x07" in html, "the escapes are what the page shows"


def test_junit_parses_and_is_escaped() -> None:
    xml = render(_doc(), "junit")
    check_output(xml, where="report junit")
    root = ET.fromstring(xml.encode("utf-8"))  # XML 1.0 refuses raw control characters
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["trace"] is not None and "\\x1b]0;pwned\\x07" in props["trace"]
    assert any("<img src=x" in (f.get("message") or "") for f in root.iter("failure"))


def test_json_gives_back_the_exact_strings() -> None:
    doc = _doc()
    text = render(doc, "json")
    check_output(text, where="report json")
    assert json.loads(text) == doc


@pytest.mark.usefixtures("terminal")
def test_report_on_a_poisoned_trace_in_every_format(evil: Path, tmp_path: Path) -> None:
    for fmt in ("md", "junit", "json"):
        r = run_cli("report", evil, "--baseline", evil, "--format", fmt)
        assert r.code == 0, r.err
        check_output(r.out + r.err, where=f"report --format {fmt}")
        if fmt == "junit":
            ET.fromstring(r.out.encode("utf-8"))
        if fmt == "json":
            assert json.loads(r.out)["trace"]["label"] == evil.name
    out = tmp_path / "report.md"
    r = run_cli("report", evil, "--format", "md", "-o", out)
    assert r.code == 0, r.err
    check_output(out.read_text(encoding="utf-8") + r.err, where="report -o")


@pytest.mark.parametrize("command", ["report", "analyze", "diff"])
def test_the_html_page_is_inert(command: str, evil: Path, evil_root: Path, tmp_path: Path) -> None:
    # the HTML page of a poisoned trace (diff: a clean baseline against it): no control character,
    # bidi override or markup reaches it, and the page can run and fetch nothing
    pytest.importorskip("matplotlib", reason="the html extra (matplotlib) is not installed")
    page = tmp_path / "page.html"
    traces = (evil_root / "clean", evil) if command == "diff" else (evil,)
    r = run_cli(command, *traces, "--html", page, *(("--format", "json") if command == "report" else ()))
    assert r.code == 0, r.err
    check_output(r.out + r.err, where=f"{command} --html's lines", shows_payload=False)
    text = page.read_text(encoding="utf-8")
    check_output(text, where=f"{command} --html")
    assert "<img src=x" not in text and "&lt;img src=x" in text  # markup stays text
    assert "content=\"default-src 'none'; style-src 'unsafe-inline'\"" in text and "<script" not in text
