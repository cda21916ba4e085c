"""docs/ci-reports.md and the example workflow stay true to the code."""

from __future__ import annotations

import re
import sys
from dataclasses import fields
from pathlib import Path

from tracetool.report.budget import Settings, parse_budget

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_documented_budget_file_parses() -> None:
    text = (DOCS / "ci-reports.md").read_text()
    block = re.search(r"```toml\n(.*?)```", text, re.S)
    assert block
    b = parse_budget(tomllib.loads(block.group(1)), "ci/latency.toml")
    assert {lim.kind for lim in b.limits} == {"absolute", "relative", "share", "slo"}


def test_every_report_setting_is_documented() -> None:
    text = (DOCS / "ci-reports.md").read_text()
    for f in fields(Settings):
        assert f"`[report] {f.name}`" in text, f"[report] {f.name} is not in docs/ci-reports.md"


def test_every_json_key_is_documented(runs) -> None:
    from tracetool.report import build_report

    doc = build_report(runs["candidate"], runs["baseline"]).to_json()
    text = (DOCS / "ci-reports.md").read_text()
    table = text[text.index("### JSON"):text.index("## Exit codes")]
    for key in doc:
        assert f"`{key}`" in table, f"JSON key {key} is not documented"
    for key in (*doc["checks"][0], *doc["comparison"][0], *doc["settings"], *doc["trace"]):
        assert f"`{key}`" in table, f"JSON key {key} is not documented"


def test_the_example_workflow_gates_and_uploads_junit() -> None:
    import yaml  # the test extra carries PyYAML

    wf = yaml.safe_load((DOCS / "examples" / "github-actions.yml").read_text())
    steps = wf["jobs"]["latency"]["steps"]
    script = "\n".join(s.get("run", "") for s in steps)
    assert "tracetool probe" in script and "tracetool import vllm-bench" in script
    assert re.search(r'tracetool report .*--format md >> "\$GITHUB_STEP_SUMMARY"', script)
    assert "--baseline traces/baseline" in script and "--budget ci/latency.toml" in script
    assert "--format junit -o latency-junit.xml" in script
    assert "--html latency/latency.html" in script  # the page, kept with the reports
    kept = next(s for s in steps if s.get("with", {}).get("name") == "latency-report")
    assert "latency/" in kept["with"]["path"].split()
    junit = [s for s in steps if "junit" in str(s.get("uses", ""))]
    assert junit and junit[0]["with"]["report_paths"] == "latency-junit.xml" and junit[0]["if"] == "always()"
