"""The Diagnosis panel shows every finding of the analyzer's catalogue, on the row of the suspect the
catalogue names (``findings_catalogue.suspect``), and names the interference on a batched trace."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Static
from tui_helpers import settle, text_of

from tests.analyzers.batch_sim import Config, run
from tracetool.trace_source import DirectorySource
from tracetool.tui.app import TraceApp
from tracetool.tui.model import View
from tracetool.tui.story import SUSPECTS, diagnosis
from tracetool.tui.widgets.diagnosis import Diagnosis

pytestmark = pytest.mark.anyio


def _catalogue(view: View) -> list[dict[str, Any]]:
    return view.analysis.query("SELECT id, suspect, severity, title FROM findings_catalogue "
                               "ORDER BY ordinal").to_pylist()


def _every_finding_fired(snapshot: Any) -> Any:
    """The snapshot with every finding of the catalogue fired (its condition as the detail), as the
    analyzer's ``findings`` table holds fired ones: warnings first, then catalogue order."""
    view = snapshot.view(None)
    fired = view.analysis.query("SELECT ordinal, id, suspect, severity, title, fires_when AS detail "
                                "FROM findings_catalogue ORDER BY severity = 'warning' DESC, ordinal")
    analysis = dataclasses.replace(view.analysis, tables={**view.analysis.tables, "findings": fired})
    return dataclasses.replace(snapshot, views={view.label: View(view.label, analysis, analysis.to_json())})


async def _panel_text(app: TraceApp) -> str:
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        return "\n".join(text_of(w) for w in app.screen.query_one(Diagnosis).query(Static))


def test_every_catalogue_suspect_has_a_row(chat: Path, snap: Any) -> None:
    suspects = {r["suspect"] for r in _catalogue(snap(chat).view(None))}
    shown = {x for s in SUSPECTS for x in s.suspects}
    assert suspects <= shown, f"suspects no Diagnosis row shows: {sorted(suspects - shown)}"


async def test_every_catalogue_finding_is_shown_in_the_diagnosis_panel(chat: Path, snap: Any) -> None:
    snapshot = _every_finding_fired(snap(chat))
    catalogue = _catalogue(snapshot.view(None))
    rows = {f["id"]: r.name for r in diagnosis(snapshot.view(None)) for f in r.findings}
    assert [f["id"] for f in catalogue if f["id"] not in rows] == []
    for f in catalogue:  # each on the row of its suspect
        assert f["suspect"] in next(s for s in SUSPECTS if s.name == rows[f["id"]]).suspects, f["id"]
    text = await _panel_text(TraceApp(DirectorySource([chat]), initial=snapshot))
    assert [f["title"] for f in catalogue if f["title"] not in text] == []


@pytest.fixture(scope="module")
def batched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Poisson arrivals into a 32-slot batch whose prefill-only iterations pause every running decode
    (tests/analyzers/batch_sim.py, as test_batched's prefill_only)."""
    return run(tmp_path_factory.mktemp("b") / "prefill-only", Config(requests=100, rate_per_s=12)).path


async def test_the_panel_names_prefill_interference_on_a_batched_trace(batched: Path, snap: Any) -> None:
    snapshot = snap(batched)
    rows = {r.name: r for r in diagnosis(snapshot.view(None))}
    assert rows["decode"].verdict == "supported"
    assert "prefill-interference" in [f["id"] for f in rows["decode"].findings]
    text = await _panel_text(TraceApp(DirectorySource([batched]), initial=snapshot))
    decode = text[text.index("decode"):]
    assert "! Co-scheduled prefill slows or pauses running decodes" in decode
