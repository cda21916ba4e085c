"""docs/findings.md and docs/analysis-json.md say exactly what the analyzer does."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from analyzer_scenarios import rows

import analyzers

REPO = Path(__file__).resolve().parents[2]


def test_findings_doc_lists_every_catalogue_id_once(toy_con: Any) -> None:
    doc = (REPO / "docs" / "findings.md").read_text()
    documented = re.findall(r"^### `([a-z0-9-]+)`", doc, re.M)
    catalogue = [r["id"] for r in rows(toy_con, "SELECT id FROM findings_catalogue ORDER BY ordinal")]
    assert documented == catalogue


def test_findings_doc_names_every_threshold() -> None:
    doc = (REPO / "docs" / "findings.md").read_text()
    for name in analyzers.Thresholds.names():
        assert f"`{name}`" in doc, name


def test_claims_and_aliases_are_documented() -> None:
    doc = (REPO / "docs" / "findings.md").read_text()
    for key in analyzers.CLAIMS:
        assert f"`{key}`" in doc, key
    for alias in analyzers.CLAIM_ALIASES:
        assert f"`{alias}`" in doc, alias


def test_json_doc_names_every_top_level_key(toy: Path) -> None:
    doc = (REPO / "docs" / "analysis-json.md").read_text()
    out = analyzers.analyze(toy, claims=["network"]).to_json()
    for key in out:
        assert f"`{key}`" in doc, key
    for key in out["decode"]:
        assert f"`{key}`" in doc, f"decode.{key}"
    est = analyzers.estimate("llama-3.1-8b", "h100-sxm").to_json()
    for key in est:
        assert f"`{key}`" in doc, f"estimate {key}"


def test_sql_objects_are_listed_in_the_json_doc() -> None:
    doc = (REPO / "docs" / "analysis-json.md").read_text()
    for name in analyzers.documented_objects():
        assert f"`{name}`" in doc, name
