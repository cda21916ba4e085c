"""The Diagnosis panel: the usual suspects, each with the analyzer's verdict, share and evidence."""

from __future__ import annotations

from collections.abc import Sequence

from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Static

from tracetool.glyphs import NOT_MEASURED
from tracetool.tui import fmt
from tracetool.tui.story import VERDICT_STYLE, DiagnosisRow

LEGEND = "✓ supported  ~ contributing  ✗ misdiagnosis  ? unmeasured"


class Diagnosis(Vertical):
    """One block per suspect: badge, name, share of e2e, verdict; the evidence; every finding on it.

    Evidence lines are their own widgets so that wrapped text keeps its indent.
    """

    def show(self, rows: Sequence[DiagnosisRow]) -> None:
        blocks: list[Static] = []
        for r in rows:
            if r.verdict is None:  # a suspect no claim judges: its findings only
                style = "$text-warning" if r.badge == "!" else "$text-muted"
                blocks.append(Static(Content.assemble((f"{r.badge} ", f"bold {style}"), (fmt.text(r.name), "bold")),
                                     classes="suspect"))
            else:
                style = VERDICT_STYLE.get(r.verdict, "")
                share = fmt.pct(r.share) if r.share is not None else NOT_MEASURED
                blocks.append(Static(Content.assemble((f"{r.badge} ", f"bold {style}"),
                                                      (f"{fmt.text(r.name):<20}", "bold"),
                                                      f"{share:>9}  ", (fmt.text(r.verdict), style)),
                                     classes="suspect"))
                blocks.append(Static(Content.styled(fmt.text(r.evidence), "$text-muted"), classes="evidence"))
            for f in r.findings:
                warn = f["severity"] == "warning"
                blocks.append(Static(Content.styled(f"{'!' if warn else '·'} {fmt.text(f['title'])}",
                                                    "$text-warning" if warn else "$text-muted"), classes="evidence"))
        blocks.append(Static(Content.styled(LEGEND, "$text-muted"), classes="legend"))
        with self.app.batch_update():
            self.remove_children()
            self.mount_all(blocks)


__all__ = ["LEGEND", "Diagnosis"]
