"""The top line: which traces, what the source says (file, connected, disconnected), which view."""

from __future__ import annotations

import re

from textual.content import Content
from textual.widget import Widget

from tracetool.tui import fmt
from tracetool.tui.model import Snapshot

#: A status longer than this is shown after the view and its counts, not before.
LATE_STATUS = 24


class StatusBar(Widget):
    """Source label and status, the view shown (``t`` cycles), requests and tokens, and the last error."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._snapshot: Snapshot | None = None
        self._selected: str | None = None
        self._status = ""
        self._error = ""
        self._busy = False

    def show(self, snapshot: Snapshot | None, selected: str | None, status: str, error: str,
             busy: bool) -> None:
        self._snapshot, self._selected, self._status, self._error, self._busy = (
            snapshot, selected, status, error, busy)
        self.refresh()

    def render(self) -> Content:
        parts: list[str | tuple[str, str]] = [(" tracetool ", "bold reverse")]
        s = self._snapshot
        label = fmt.text(s.source_label) if s else ""
        parts += [" ", (label, "bold")]
        status = fmt.text(self._status or (s.status if s else ""))
        # a live source's status (every server's state, tokens, rate) is long: it goes last, so the
        # view shown and its counts are never the part cut off at the terminal's edge
        late = len(status) > LATE_STATUS
        if status and not late:
            parts += ["  ", (status, _status_style(status))]
        if self._error:  # the error first: it is what the user needs to read
            parts += ["  ", ("⚠ " + fmt.text(_short_paths(self._error)), "bold $text-error")]
        elif s is not None:
            view = s.view(self._selected)
            if len(s.labels) > 1:  # a live snapshot holds only the view it was asked for
                parts += ["  view ", (fmt.text(view.label), "bold $text-accent"),
                          (f" ({len(s.labels) - 1} traces, t)", "$text-muted")]
            doc = view.doc
            tokens = (doc.get("decode") or {}).get("output_tokens")
            parts += ["  ", f"{fmt.count(doc.get('requests'))} requests", "  ", f"{fmt.count(tokens)} tokens"]
            if doc.get("failed_requests"):
                parts += ["  ", (f"{doc['failed_requests']:,} failed", "$text-error")]
            if view.first_look:
                parts += ["  ", ("first look: the requests", "$text-warning")]
        if self._busy:
            parts += ["  ", ("analysing…", "$text-warning")]
        if status and late:
            parts += ["  ", (status, _status_style(status))]
        return Content.assemble(*parts).truncate(self.size.width, ellipsis=True)



def _status_style(status: str) -> str:
    return "$text-error" if "disconnected" in status or "error" in status else "$text-muted"


def _short_paths(text: str) -> str:
    """``/long/dir/chat/tokens.arrows`` -> ``chat/tokens.arrows``: the header has one line."""
    return re.sub(r"(?:/[^\s/:]+)*/([^\s/:]+/[^\s/:]+)", r"\1", text)


__all__ = ["StatusBar"]
