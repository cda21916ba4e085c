"""The screens as tabs under the status line: the current one highlighted, each clickable."""

from __future__ import annotations

from textual.content import Content
from textual.widget import Widget

#: (mode, key, title) in key order.
TABS = (("overview", "1", "Overview"), ("decode", "2", "Decode"), ("system", "3", "GPU/CPU"),
        ("requests", "4", "Requests"), ("sql", "5", "SQL"), ("tail", "6", "Tail"))


class NavBar(Widget):
    """``1 Overview  2 Decode  3 GPU/CPU  4 Requests  5 SQL  6 Tail``; ``current`` is the mode shown."""

    def __init__(self, current: str, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.current = current

    def render(self) -> Content:
        parts: list[Content | str] = []
        for mode, key, title in TABS:
            style = "bold reverse $text-accent" if mode == self.current else ""
            parts.append(Content.from_markup(f"[@click=app.switch_mode('{mode}')]{key} {title}[/]")
                         .stylize(style))
            parts.append("  ")
        parts.append(Content.styled("? help  h hypothesis  q quit", "$text-muted"))
        return Content.assemble(*parts).truncate(self.size.width, ellipsis=True)


__all__ = ["TABS", "NavBar"]
