"""What every trace screen shares: the status line, the tabs, the footer, and when to reload.

Attributes down: the app holds the analysed :class:`~tracetool.tui.model.Snapshot`
and the selected view as reactives; each screen watches them and redraws
itself from :meth:`TraceScreen.show_view`. A screen that is not on top marks
itself stale and redraws when it comes back, so a live source refreshing at
5 Hz costs only the screen the user is looking at.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, Protocol, runtime_checkable

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Static

from tracetool.trace_source import TraceSource
from tracetool.tui.model import Snapshot, View
from tracetool.tui.widgets.nav_bar import NavBar
from tracetool.tui.widgets.status_bar import StatusBar


@runtime_checkable
class TraceAppState(Protocol):
    """What a screen reads of the app (:class:`tracetool.tui.app.TraceApp`, which imports the
    screens: they know this state, never the app's module). Attributes down: the screens watch
    ``snapshot`` and ``selected`` and redraw."""

    snapshot: Snapshot | None
    selected: str | None
    busy: bool
    error_line: str
    status_line: str
    source: TraceSource

    def current_view(self) -> View | None:
        """The view shown: the selected one of the latest snapshot (None before the first)."""
        ...

    def overview_painted(self, whole: bool = True) -> None:
        """The overview has drawn an analysis, ``whole`` or a first look (the app times the first paint)."""
        ...


class TraceScreen(Screen[None]):
    """A screen of the app's modes; subclasses compose :meth:`compose_body` and implement :meth:`show_view`."""

    MODE: ClassVar[str] = ""
    #: Whether the screen draws a first look (:attr:`View.first_look`); the others say that they follow.
    FIRST_LOOK: ClassVar[bool] = False
    #: Watched app attributes that change the status line.
    _HEADER_ATTRS = ("snapshot", "selected", "busy", "error_line", "status_line")

    def __init__(self) -> None:
        super().__init__()
        self._stale = True
        self._shown: tuple[int, str] | None = None

    @property
    def trace_app(self) -> TraceAppState:
        assert isinstance(self.app, TraceAppState)
        return self.app

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        yield NavBar(self.MODE, id="nav")
        yield Static(FIRST_LOOK_NOTE, id="first-look")
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> Iterable[Widget]:
        return ()

    def on_mount(self) -> None:
        for attr in self._HEADER_ATTRS:
            self.watch(self.app, attr, self._header_changed, init=False)
        self.watch(self.app, "snapshot", self._data_changed, init=False)
        self.watch(self.app, "selected", self._data_changed, init=False)
        self._header_changed(None)
        self._data_changed(None)

    def on_screen_resume(self) -> None:
        self._header_changed(None)
        if self._stale:
            self._reload()

    def _header_changed(self, _value: Any) -> None:
        app = self.trace_app
        self.query_one(StatusBar).show(app.snapshot, app.selected, app.status_line, app.error_line, app.busy)

    def _data_changed(self, _value: Any) -> None:
        self._stale = True
        if self.is_current:
            self._reload()

    def _reload(self) -> None:
        view = self.trace_app.current_view()
        if view is None:
            self.show_waiting()
            return
        # a first look on a screen that does not draw one: the screen says so, and shows the whole analysis
        # when it comes (its snapshot is a new one, and changes _shown's key)
        self.set_class(view.first_look and not self.FIRST_LOOK, "-first-look")
        if view.first_look and not self.FIRST_LOOK:
            self._stale = False
            return
        key = (self.trace_app.snapshot.generation if self.trace_app.snapshot else -1, view.label)
        self._stale = False
        if key == self._shown:
            return
        self._shown = key
        self.show_view(view)

    def show_view(self, view: View) -> None:
        """Draw ``view``; start workers for anything that needs SQL."""

    def show_waiting(self) -> None:
        """Nothing analysed yet (a live source with no data)."""


#: What a screen other than the Overview says while the analysis is a first look.
FIRST_LOOK_NOTE = ("Analysing each token's gap to the one before (a big trace): this screen follows in a few "
                   "seconds. The Overview (1) has the requests already.")

__all__ = ["FIRST_LOOK_NOTE", "TraceAppState", "TraceScreen"]
