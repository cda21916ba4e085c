"""The tail screen (key ``6``) shows each tail scenario's cause as ``tracetool analyze --json`` names it.

For every scenario of tail_scenarios.CASES, noise included: the screen's findings are the analysis'
tail findings, the scenario's among them and no other cause; each metric's panel shows the tail object
``analyze --json`` gives; and the panel of the tail the finding is about shows its extra time first in
the scenario's component.
"""

from __future__ import annotations

from typing import Any

import pytest
from tui_helpers import screen_text, settle, text_of

from tests.analyzers.tail_scenarios import CASES, Case
from tracetool.tui import fmt
from tracetool.tui.widgets.tail import NAME_W

pytestmark = pytest.mark.anyio

BAR = "▏▎▍▌▋▊▉█"

TAIL_IDS = ("tail-queue-bursts", "tail-long-prompts", "tail-prefill-interference", "tail-preemption",
            "tail-slow-replica", "tail-client-delay", "tail-new-connections", "tail-long-outputs", "tail-noise")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
async def test_the_tail_screen_shows_each_scenarios_cause(case: Case, tail_runs: Any, make_app: Any) -> None:
    from tracetool.tui.screens.tail import TailScreen
    from tracetool.tui.widgets.tail import TailPanel

    cli_doc = tail_runs.doc(case.name)
    named = tail_runs.tail_findings(case.name)
    app = make_app(tail_runs.path(case.name))
    async with app.run_test(size=(160, 60)) as pilot:
        await settle(pilot)
        await pilot.press("6")
        await settle(pilot)
        assert isinstance(app.screen, TailScreen)
        text = screen_text(app)
        # the findings come first: on screen without scrolling, each with its title and the start of its evidence
        shown = {i for i in TAIL_IDS if i in text}
        assert shown == set(named), (shown, set(named))
        assert case.finding in shown
        for f in named.values():
            assert f["title"] in text and f["detail"][:60] in text, f["id"]
        panels = {p.metric: p for p in app.screen.query(TailPanel)}
        for metric, p in panels.items():  # what analyze --json says of each metric's tail
            assert (p._tail or {}).get("sentence") == (cli_doc["tail"][metric] or {}).get("sentence"), metric
        cause = named[case.finding]
        panel = text_of(panels[cause["metric"]])
    assert panel.startswith(cli_doc["tail"][cause["metric"]]["sentence"][:60])
    if case.component is None:
        assert set(named) == {"tail-noise"} and "a tail of noise" in panel
        return
    assert set(named) - {case.finding} <= case.also
    # the component rows: the scenario's shows the JSON's share of the gap and the longest bar
    tail = cli_doc["tail"][cause["metric"]]
    assert tail["top_component"] == case.component
    share = tail[tail["explained"]]["components"][case.component]["gap_share"]
    bars = {line[:NAME_W].strip(): sum(ch in BAR for ch in line) for line in panel.splitlines()[2:]
            if line[:NAME_W].strip() in tail[tail["explained"]]["components"]}
    row = next(line for line in panel.splitlines() if line[:NAME_W].strip() == case.component)
    assert fmt.pct(share) in row
    assert max(bars, key=lambda k: bars[k]) == case.component, bars
