"""Golden files pin the bytes of the md, json and junit reports for fixed traces.

Regenerate after looking at the diff: ``TRACETOOL_UPDATE_GOLDENS=1 pytest tests/report/test_golden.py``.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

import pytest
from report_mdcheck import tables
from report_synth import GOLDEN

from tracetool.report import FORMAT, VERSION, build_report, load_budget, render

EXT = {"md": "md", "json": "json", "junit": "xml"}
#: scenario -> (trace, baseline, budget file in golden/)
SCENARIOS = {
    "noise": ("candidate", "baseline", None),
    "regression": ("regressed", "baseline", "regression-budget.toml"),
    "imported": ("imported", None, "imported-budget.toml"),
}


def _doc(runs, scenario: str) -> dict:
    trace, base, budget = SCENARIOS[scenario]
    b = load_budget(GOLDEN / budget) if budget else None
    return build_report(runs[trace], runs[base] if base else None, b).to_json()


@pytest.fixture(scope="module")
def docs(runs) -> dict[str, dict]:
    return {s: _doc(runs, s) for s in SCENARIOS}


@pytest.mark.parametrize("fmt", ["md", "json", "junit"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_golden(docs, scenario: str, fmt: str) -> None:
    text = render(docs[scenario], fmt)
    path = GOLDEN / f"{scenario}.{EXT[fmt]}"
    if os.environ.get("TRACETOOL_UPDATE_GOLDENS"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden {path.name}: run with TRACETOOL_UPDATE_GOLDENS=1"
    assert text == path.read_text(encoding="utf-8"), f"{path.name} changed"


def test_goldens_say_what_they_should(docs) -> None:
    """The pinned files are the right ones: noise passes, the ITL regression fails, the import skips."""
    assert docs["noise"]["passed"] and docs["noise"]["summary"]["failed"] == 0
    reg = {c["key"]: c["status"] for c in docs["regression"]["checks"]}
    assert not docs["regression"]["passed"]
    assert reg["p50_itl_pct"] == "fail" and reg["p95_itl_ms"] == "fail" and reg["decode"] == "pass"
    imp = {c["key"]: c["status"] for c in docs["imported"]["checks"]}
    assert imp["network"] == "skip" and imp["p95_ttft_ms"] == "pass" and imp["p99_e2e_ms"] == "fail"
    assert docs["imported"]["trace"]["source"] == "vllm-bench"
    assert docs["imported"]["trace"]["failed_requests"] == 1


def test_outputs_hold_no_paths_or_times(docs, trace_dirs) -> None:
    for doc in docs.values():
        for fmt in EXT:
            text = render(doc, fmt)
            for p in trace_dirs.values():
                assert str(p.parent) not in text
            assert str(GOLDEN) not in text


def test_json_is_versioned(docs) -> None:
    for doc in docs.values():
        parsed = json.loads(render(doc, "json"))
        assert parsed["format"] == FORMAT == "tracetool-report" and parsed["version"] == VERSION == 1
        assert list(parsed)[:2] == ["format", "version"]


def test_junit_parses_with_the_right_counts(docs) -> None:
    for doc in docs.values():
        root = ET.fromstring(render(doc, "junit"))
        suite = root.find("testsuite")
        assert root.tag == "testsuites" and suite is not None
        cases = suite.findall("testcase")
        failures = [c for c in cases if c.find("failure") is not None]
        skipped = [c for c in cases if c.find("skipped") is not None]
        assert len(cases) == len(doc["checks"]) == int(suite.get("tests")) == int(root.get("tests"))
        assert len(failures) == doc["summary"]["failed"] == int(suite.get("failures"))
        assert len(skipped) == doc["summary"]["skipped"] == int(suite.get("skipped"))
        assert suite.get("errors") == "0"
        for c, check in zip(cases, doc["checks"], strict=True):
            assert c.get("name").startswith(check["key"] + ": ")
            f = c.find("failure")
            if f is not None:  # the numbers are in the message
                assert f.get("message") == check["message"] and any(ch.isdigit() for ch in f.get("message"))


def test_markdown_tables_are_github_flavoured(docs) -> None:
    md = render(docs["regression"], "md")
    found = {t[0][1] if t[0][0] == "" else t[0][0]: t for t in tables(md)}
    assert set(found) == {"check", "metric", "statistic", "component", "finding"}
    assert len(found["check"]) - 1 == len(docs["regression"]["checks"])
    assert len(found["metric"]) == 5  # header + TTFT, ITL, TPOT, e2e
    assert {r[0] for r in found["check"][1:]} <= {"✅", "⚠️", "❌", "⚪"}
    assert md.startswith("## ❌ Latency report: `regressed` vs baseline `baseline`\n")
    assert render(docs["noise"], "md").startswith("## ✅ ")
    tables(render(docs["imported"], "md"))  # structure holds there too
