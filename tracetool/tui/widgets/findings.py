"""Every finding that fired, warnings first, with the numbers it quotes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Static

from tracetool.tui import fmt


class Findings(Vertical):
    """Findings of the analysis (docs/findings.md), as the analyzer wrote them."""

    def show(self, findings: Sequence[dict[str, Any]], empty: Content | None = None) -> None:
        blocks: list[Static] = []
        for f in findings:
            warn = f["severity"] == "warning"
            blocks.append(Static(Content.assemble(("! " if warn else "· ", "$text-warning" if warn else "$text-muted"),
                                                  (fmt.text(f["title"]), "bold"),
                                                  (f"  {fmt.text(f['id'])}", "$text-muted")),
                                 classes="finding"))
            blocks.append(Static(Content.styled(fmt.text(f["detail"]), "$text-muted"), classes="evidence"))
        if not blocks:
            blocks.append(Static(empty or Content.styled("no findings fired", "$text-muted")))
        with self.app.batch_update():
            self.remove_children()
            self.mount_all(blocks)


__all__ = ["Findings"]
