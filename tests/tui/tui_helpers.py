"""Helpers the TUI tests share (pytest imports this directory's modules by name)."""

from __future__ import annotations

from typing import Any


async def settle(pilot: Any) -> None:
    """Wait until no worker runs and every message they posted has been handled. A worker the app cancelled
    (it exited: a first analysis that failed ends it) has settled too."""
    from textual.worker import WorkerCancelled

    for _ in range(50):
        try:
            await pilot.app.workers.wait_for_complete()
        except WorkerCancelled:
            pass
        await pilot.pause()
        if not any(w.is_running for w in pilot.app.workers):
            await pilot.pause()
            return
    raise AssertionError("workers did not settle")


def text_of(widget: Any) -> str:
    """The plain text a Static (or any widget with render()) shows."""
    content = getattr(widget, "content", None)
    if content is None:
        content = widget.render()
    return getattr(content, "plain", None) or str(content)


def screen_text(app: Any) -> str:
    """Everything the screen shows, as plain text lines (what a user reads)."""
    strips = app.screen._compositor.render_strips()  # the composited screen, as drawn
    return "\n".join(s.text for s in strips)
