"""The group key: pick which of a dataset's groups (``server=a``…) the screens show, or all of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from tracetool.tui import fmt
from tracetool.untrusted import NAME_LIMIT


@dataclass(frozen=True)
class GroupRow:
    """One row of the picker: a group (or ``all``), its trace count, and what an analysis of it
    said once one ran (None until then: the picker never analyses, it only remembers)."""

    name: str
    traces: int
    requests: int | None = None
    bottleneck: str | None = None


class GroupScreen(ModalScreen[str | None]):
    """A list of ``all`` and each group; enter picks one (dismissed with its name), esc keeps the one shown."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,g", "dismiss_none", "Close")]

    def __init__(self, rows: Sequence[GroupRow], current: str, group_by: Sequence[str]) -> None:
        super().__init__()
        self.rows = list(rows)
        self.current = current
        self.group_by = list(group_by)

    def compose(self) -> ComposeResult:
        width = max(len(r.name) for r in self.rows)
        with Vertical(id="groups"):
            yield Static(Content.assemble(("Pick a group", "bold"),
                                          (f"  by {', '.join(self.group_by)} · enter shows it, t then steps "
                                           "through its traces; esc closes", "$text-muted")))
            options = OptionList(*(Option(_row(r, width, r.name == self.current), id=r.name) for r in self.rows),
                                 id="group-list")
            yield options

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        options.highlighted = next((i for i, r in enumerate(self.rows) if r.name == self.current), 0)
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)


def _row(r: GroupRow, width: int, current: bool) -> Content:
    parts: list[str | tuple[str, str]] = [
        ("● " if current else "  ", "$text-accent"), (fmt.text(r.name, NAME_LIMIT).ljust(width), "bold"),
        ("  ", ""), (f"{r.traces} trace{'s' if r.traces != 1 else ''}".rjust(10), ""),
    ]
    if r.requests is not None:
        parts += [("  ", ""), (f"{fmt.count(r.requests)} requests".rjust(14), "")]
    if r.bottleneck:
        parts += [("  ", ""), (f"{fmt.text(r.bottleneck)} is the bottleneck", "$text-muted")]
    elif r.requests is None:
        parts += [("  ", ""), ("not analysed yet", "$text-muted")]
    return Content.assemble(*parts)


__all__ = ["GroupRow", "GroupScreen"]
