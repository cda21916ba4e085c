"""The hypothesis key: pick the story you came in with and read the analyzer's verdict on it."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from tracetool.errors import UsageError
from tracetool.tui import fmt
from tracetool.tui.model import View
from tracetool.tui.story import VERDICT_STYLE, Verdict, judge, stories
from tracetool.untrusted import SAFE_TEXT


class HypothesisScreen(ModalScreen[None]):
    """A list of stories (the analyzer's claim catalogue) and a line for your own words."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "app.pop_screen", "Close")]

    def __init__(self, view: View) -> None:
        super().__init__()
        self.view = view

    def compose(self) -> ComposeResult:
        with Vertical(id="hypothesis"):
            yield Static(Content.assemble(("Test a hypothesis", "bold"),
                                          ("  pick a story (enter) or type your own; esc closes", "$text-muted")))
            yield Static("", id="verdict")
            yield OptionList(*(Option(s.words, id=s.key) for s in stories()), id="stories")
            yield Input(placeholder="or in your words: it's the network / decode is compute-bound / …",
                        id="story-input", restrict=SAFE_TEXT)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is not None:
            self.show_verdict(str(event.option.prompt), event.option.id)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        words = event.value.strip()
        if words:
            self.show_verdict(words, words)

    def show_verdict(self, words: str, claim: str) -> None:
        out = self.query_one("#verdict", Static)
        try:
            v = judge(self.view, claim)
        except UsageError:
            out.update(Content.styled(f"no claim matches {words!r}: try network, tokenizer, queueing, prefill, "
                                      "decode, compute-bound, throughput", "$text-error"))
            return
        out.update(render_verdict(v, words))


def render_verdict(v: Verdict, words: str) -> Content:
    style = VERDICT_STYLE.get(v.verdict, "")
    parts: list[str | tuple[str, str]] = [
        (f"“{words}”", "italic"), ("  → ", "$text-muted"), (f"{v.badge} {v.verdict.upper()}", f"bold {style}"),
    ]
    if v.share is not None:
        parts += [(f"  {v.component} holds ", "$text-muted"), (fmt.pct(v.share), "bold"), (" of e2e", "$text-muted")]
    if v.statement != words:
        parts += ["\n", (fmt.text(v.statement), "$text-muted")]
    parts += ["\n", fmt.text(v.detail)]
    for f in v.findings:
        mark = "!" if f["severity"] == "warning" else "·"
        parts += ["\n", (f"{mark} {fmt.text(f['title'])}: ", "bold"), (fmt.text(f["detail"]), "$text-muted")]
    return Content.assemble(*parts)


__all__ = ["HypothesisScreen", "render_verdict"]
