"""The ``?`` screen: keys, screens, badges, and where the numbers come from."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = (
    ("1 2 3 4 5 6", "Overview, Decode, GPU/CPU, Requests, SQL, Tail"),
    ("h", "test a hypothesis: pick a story, get the analyzer's verdict with numbers"),
    ("t", "next trace: all traces together, then each one (several traces or servers)"),
    ("g", "pick a dataset's group (server=a…; t then steps within it), or a live server"),
    ("r", "reload: read the trace again and re-analyse"),
    ("T", "dark / light theme"),
    ("e f i n b", "Requests: sort by e2e, TTFT, ITL p50, tokens, bottleneck (again: reverse)"),
    ("enter / esc", "Requests: open a request / go back"),
    ("/ enter esc", "SQL: edit, run, stop a query or leave the input"),
    ("? / q", "this help / quit"),
)

TEXT = (
    "Every figure comes from the analyzers (tracetool analyze): the screens only draw them. Components "
    "follow the attribution rule of docs/trace-format.md; \"not measured\" means the trace cannot say "
    "(unknown, not zero). Shares are of the summed e2e.",
    "Diagnosis badges: ✓ supported (the story holds), ~ contributing, ✗ misdiagnosis (measured, and too "
    "small to matter), ? unmeasured (record what is missing). Thresholds and the findings catalogue: "
    "docs/findings.md.",
)


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,question_mark,q", "app.pop_screen", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(Content.styled("tracetool tui · keys", "bold"), classes="help-title")
            for key, what in KEYS:
                with Horizontal(classes="help-row"):
                    yield Static(Content.styled(key, "bold $text-accent"), classes="help-key")
                    yield Static(what, classes="help-what")
            for paragraph in TEXT:
                yield Static(Content.styled(paragraph, "$text-muted"), classes="help-text")
            yield Static(Content.styled("esc closes", "$text-muted"), classes="help-text")


__all__ = ["HelpScreen"]
