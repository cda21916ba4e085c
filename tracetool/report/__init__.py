"""``tracetool report``: a CI latency report and a pass/fail gate that does not flap on noise.

Layers (one way): :mod:`~tracetool.report.stats` (percentiles, request-level
bootstrap, Mann-Whitney; numpy only), :mod:`~tracetool.report.budget` (the TOML
budget file), :mod:`~tracetool.report.gate` (comparisons and checks),
:mod:`~tracetool.report.build` (runs :func:`analyzers.analyze` and makes the
versioned JSON document), and the renderers (Markdown, JUnit), which read only
that document. This package sits beside the CLI, above the analyzers: importing
it loads numpy, not DuckDB; :func:`analyse` imports the analyzers when called.

Public API::

    run = analyse("trace-dir", AnalysisOptions(claims=("network",)))  # -> Run
    base = analyse("baseline-dir", role="baseline")
    report = build_report(run, base, load_budget("budget.toml"))       # -> Report
    doc = report.to_json()               # {"format": "tracetool-report", "version": 1, ...}
    text = render(doc, "md")             # or "json", "junit"
    report.passed, report.failing_lines()
"""

from __future__ import annotations

import json
from typing import Any

from tracetool.report.budget import Budget, Limit, Settings, load_budget, parse_budget
from tracetool.report.build import FORMAT, VERSION, Report, Run, analyse, build_report, samples_of
from tracetool.report.render_junit import render_junit
from tracetool.report.render_md import render_markdown
from tracetool.report.stats import Interval, Sample, bootstrap_relative, mann_whitney_greater
from tracetool.untrusted import json_escaped

FORMATS = ("md", "json", "junit")


def render(doc: dict[str, Any], format: str) -> str:
    """The report document as ``md``, ``json`` (stable key order, two-space indent; characters a
    terminal would act on as ``\\u`` escapes) or ``junit``."""
    if format == "md":
        return render_markdown(doc)
    if format == "junit":
        return render_junit(doc)
    if format == "json":
        return json_escaped(json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False)) + "\n"
    raise ValueError(f"unknown format {format!r}")


__all__ = ["FORMAT", "FORMATS", "VERSION", "Budget", "Interval", "Limit", "Report", "Run", "Sample",
           "Settings", "analyse", "bootstrap_relative", "build_report", "load_budget",
           "mann_whitney_greater", "parse_budget", "render", "render_junit", "render_markdown", "samples_of"]
