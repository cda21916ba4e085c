"""The Textual app: one analysis of a trace source, shown on six screens.

Data flow (attributes down, messages up):

* the app owns a :class:`~tracetool.trace_source.TraceSource` and the latest
  analysed :class:`~tracetool.tui.model.Snapshot` (reactive ``snapshot``);
* :meth:`TraceApp.request_analysis` starts the one analysis worker (a thread:
  ``source.snapshot()`` then :func:`analyzers.analyze`), which posts
  :class:`TraceApp.AnalysisReady` or :class:`TraceApp.AnalysisFailed`; the
  handler sets ``snapshot`` and every screen redraws from it;
* a live source (``source.live``) gets a timer every ``source.refresh_s``
  seconds that calls :meth:`request_analysis`: the UI keeps running while
  workers analyse. Up to :attr:`TraceApp.LIVE_PIPELINE` analyses of
  successive snapshots run at once (DuckDB releases the GIL), so the view
  updates at ``1 / refresh_s`` even when one analysis takes longer than a
  tick; a result older than the one shown is dropped, and a tick that finds
  the pipeline full asks for one more run when a worker finishes instead of
  piling up threads.

Nothing here touches DuckDB on the UI thread, and nothing in a worker touches
a widget: workers post messages.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.reactive import var
from textual.worker import get_current_worker

from analyzers.options import AnalysisOptions
from tracetool.errors import TracetoolError
from tracetool.trace_source import GroupedSource, TraceSource
from tracetool.tui import fmt
from tracetool.tui.model import ALL, Sessions, Snapshot, View, analyse, complete
from tracetool.tui.screens.decode import DecodeScreen
from tracetool.tui.screens.groups import GroupRow, GroupScreen
from tracetool.tui.screens.help import HelpScreen
from tracetool.tui.screens.hypothesis import HypothesisScreen
from tracetool.tui.screens.overview import OverviewScreen
from tracetool.tui.screens.requests import RequestsScreen
from tracetool.tui.screens.sql import SqlScreen
from tracetool.tui.screens.system import SystemScreen
from tracetool.tui.screens.tail import TailScreen

THEMES = {"dark": "textual-dark", "light": "textual-light"}


class TraceApp(App[int]):
    """``tracetool tui``: where the time went, and which story is wrong."""

    TITLE = "tracetool"
    CSS_PATH = "styles/app.tcss"
    MODES: ClassVar = {"overview": OverviewScreen, "decode": DecodeScreen, "system": SystemScreen,
                       "requests": RequestsScreen, "sql": SqlScreen, "tail": TailScreen}
    DEFAULT_MODE: ClassVar[str] = "overview"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]  # noqa: RUF012 (Textual reads it)
    VERTICAL_BREAKPOINTS = [(0, "-short"), (40, "-tall")]  # noqa: RUF012
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("h", "hypothesis", "Test a story"),
        Binding("t", "next_trace", "Trace"),
        Binding("g", "pick_group", "Group"),  # datasets with key=value folders, live servers (check_action)
        Binding("r", "reload", "Reload"),
        Binding("T", "toggle_theme", "Theme", key_display="T"),
        Binding("w", "window", "Window"),  # live sources only (check_action)
        Binding("1", "switch_mode('overview')", "Overview", show=False),
        Binding("2", "switch_mode('decode')", "Decode", show=False),
        Binding("3", "switch_mode('system')", "GPU/CPU", show=False),
        Binding("4", "switch_mode('requests')", "Requests", show=False),
        Binding("5", "switch_mode('sql')", "SQL", show=False),
        Binding("6", "switch_mode('tail')", "Tail", show=False),
    ]

    #: Analyses of a live source in flight at once (a static source has one at a time).
    LIVE_PIPELINE: ClassVar[int] = 2
    #: The GIL switch interval (seconds) while attached to a live source. A live TUI runs the UI,
    #: a client thread per stream and the analyses side by side; an analysis thread that gets the
    #: GIL back after each DuckDB call otherwise waits up to Python's default 5 ms each time,
    #: behind threads that hold it for whole slices (``bench_live.py --only view`` measured more
    #: analysed views per second at 1 ms). Restored when the app unmounts.
    LIVE_SWITCH_INTERVAL_S: ClassVar[float] = 0.001

    #: The latest analysed snapshot (None until the first analysis finishes).
    snapshot: var[Snapshot | None] = var(None)
    #: The label of the view shown ("all" or a trace), None for the first one.
    selected: var[str | None] = var(None)
    #: The dataset group analysed (``server=a``), None for every trace (``g`` picks it).
    group: var[str | None] = var(None)
    busy: var[bool] = var(False)
    error_line: var[str] = var("")
    status_line: var[str] = var("")

    class AnalysisReady(Message):
        """A worker finished analysing a snapshot of the source."""

        def __init__(self, snapshot: Snapshot | None, status: str) -> None:
            super().__init__()
            self.snapshot = snapshot
            self.status = status

    class AnalysisFailed(Message):
        """A worker could not analyse the snapshot; ``error`` is one line, ``exc`` the expected failure."""

        def __init__(self, error: str, status: str, exc: TracetoolError | None = None) -> None:
            super().__init__()
            self.error = error
            self.status = status
            self.exc = exc

    class OverviewReady(Message):
        """The overview shows analysed figures for the first time (time to first paint)."""

    def __init__(self, source: TraceSource, options: AnalysisOptions | None = None, *,
                 initial: Snapshot | Future[Any] | None = None, theme: str = "dark",
                 timings: dict[str, float] | None = None, timings_path: Path | None = None) -> None:
        """Args:
            source: where the traces come from (a directory now, a live stream next).
            options: analyzer options (``--model``, ``--gpu``).
            initial: a snapshot already analysed, or a Future of one (the CLI starts the first
                analysis before importing textual); None to analyse on mount.
            theme: ``dark``, ``light`` or a Textual theme name.
            timings: start-up marks (``time.time()``) to extend with ``painted``; kept by reference.
            timings_path: where to write ``timings`` as JSON at first paint (benchmarks).
        """
        super().__init__()
        self.source = source
        self.options = options or AnalysisOptions()
        self.theme = THEMES.get(theme, theme)
        self._initial = initial
        self._generation = 1 if initial is not None else 0
        self._inflight = 0
        self._again = False
        #: Wall-clock marks (time.time()) of start-up phases; "painted" is added at first paint.
        self.timings = timings if timings is not None else {}
        self._timings_path = timings_path
        self._painted = False
        #: The expected failure that ended the app (the first analysis of a static source failed).
        self.fatal: TracetoolError | None = None
        self._switch_interval: float | None = None  # Python's, while a live source lowers it
        #: a live view's analyzer connections, reused from tick to tick (tui.model.Sessions)
        self._sessions = Sessions(keep=self.LIVE_PIPELINE) if source.live else None
        #: group name (or "all") -> (requests, bottleneck) of its last analysis, for the picker
        self._group_stats: dict[str, tuple[int | None, str | None]] = {}
        self._can_group = False
        self._warned: set[str] = set()
        #: the first look being completed (a worker runs DuckDB on its connection), None otherwise
        self._completing: Snapshot | None = None

    # -- analysis ---------------------------------------------------------------------------
    def on_mount(self) -> None:
        self.status_line = self.source.status()
        self._say_warnings(self._initial if isinstance(self._initial, Snapshot) else None)
        if isinstance(self._initial, Snapshot):
            self.snapshot = self._initial
        elif isinstance(self._initial, Future):
            self._inflight = 1
            self.busy = True
            self._await_first(self._initial)
        else:
            self.request_analysis()
        if self.source.live:
            self._switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(self._switch_interval, self.LIVE_SWITCH_INTERVAL_S))
            self.set_interval(max(0.05, self.source.refresh_s), self.request_analysis)
            # the header (connection state, tokens received) moves at refresh_s even when an
            # analysis takes longer: status() is cheap and never blocks
            self.set_interval(max(0.05, self.source.refresh_s), self._poll_status)

    def on_unmount(self) -> None:
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)
            self._switch_interval = None
        if self._sessions is not None:
            self._sessions.close()

    def _poll_status(self) -> None:
        self.status_line = _status(self.source)

    def request_analysis(self, reload: bool = False) -> None:
        """Analyse a new snapshot of the source in a worker (or once more when one finishes)."""
        if self._inflight >= (self.LIVE_PIPELINE if self.source.live else 1):
            self._again = True
            return
        self._inflight += 1
        self._generation += 1
        if not self.source.live or self.snapshot is None:
            self.busy = True
        self._analyse(self._generation, reload, self.group)

    @work(thread=True, exclusive=True, group="analysis", exit_on_error=False)
    def _await_first(self, first: Future[Any]) -> None:
        try:
            snap = first.result()
        except TracetoolError as e:
            self.post_message(self.AnalysisFailed(str(e), _status(self.source), e))
            return
        except Exception as e:
            self.post_message(self.AnalysisFailed(f"{type(e).__name__}: {e}", _status(self.source)))
            return
        self.post_message(self.AnalysisReady(snap, _status(self.source)))

    @work(thread=True, exclusive=False, group="analysis", exit_on_error=False)
    def _analyse(self, generation: int, reload: bool, group: str | None) -> None:
        worker = get_current_worker()
        try:
            if reload:
                self.source.reload()
            shown = self.snapshot
            # a static source's traces do not change unless reloaded: what is on screen is built on, not redone
            same = shown if shown is not None and not reload and not self.source.live and shown.group == group else None
            if same is not None and same.first_look:
                self._completing = same
                try:
                    snap: Snapshot | None = complete(same, generation, _status(self.source))
                finally:
                    self._completing = None
            else:
                only = (self.selected or ALL) if self.source.live else None
                together = same.views[ALL].analysis if same is not None and ALL in same.views else None
                # a big trace reloaded: a first look first, as at start-up
                snap = analyse(self.source, self.options, generation, only=only, sessions=self._sessions,
                               group=group, behind=shown is not None, cancelled=lambda: worker.is_cancelled,
                               together=together, first_look=True)
        except TracetoolError as e:
            self.post_message(self.AnalysisFailed(str(e), _status(self.source), e))
            return
        except Exception as e:  # a worker must report, not die silently
            self.post_message(self.AnalysisFailed(f"{type(e).__name__}: {e}", _status(self.source)))
            return
        if not worker.is_cancelled:
            self.post_message(self.AnalysisReady(snap, _status(self.source)))

    def _say_warnings(self, snapshot: Snapshot | None = None) -> None:
        """A dataset's traces set aside as unreadable, readers' warnings and the analyses' (a meta.json
        model block's keys not used): each said once, in a notice (as ``analyze`` says them on stderr);
        the status line keeps the count."""
        analysed = [w for v in snapshot.views.values() for w in v.analysis.warnings] if snapshot else []
        for w in [*self.source.warnings, *analysed]:
            if w not in self._warned:
                self._warned.add(w)
                self.notify(fmt.text(w), title="warning", severity="warning", timeout=10, markup=False)

    def on_trace_app_analysis_ready(self, message: AnalysisReady) -> None:
        self._finished()
        if not self.source.live:
            self._say_warnings(message.snapshot)
        self.status_line = message.status
        self.error_line = ""
        shown = self.snapshot
        if message.snapshot is not None and (shown is None or message.snapshot.generation > shown.generation):
            if self.selected is not None and self.selected not in message.snapshot.labels:
                self.selected = None
            self.snapshot = message.snapshot
            self._remember(message.snapshot)
            if not self.source.live and (self.snapshot.first_look
                                         or len(self.snapshot.views) < len(self.snapshot.labels)):
                # the first paint was a first look (each token's gap follows), or had the traces together
                # (each alone follows)
                self.request_analysis()
        if self._group_choices() != self._can_group:  # the footer offers g once there is a choice
            self._can_group = not self._can_group
            self.refresh_bindings()

    def on_trace_app_analysis_failed(self, message: AnalysisFailed) -> None:
        if self.snapshot is None and not self.source.live and message.exc is not None:
            self.fatal = message.exc  # nothing to show: the CLI prints the one line and exits 3
            self.exit(return_code=message.exc.exit_code)
            return
        self._finished()
        self.status_line = message.status
        self.error_line = message.error
        self.notify(fmt.text(message.error), title="analysis failed", severity="error", timeout=6, markup=False)

    def _finished(self) -> None:
        self._inflight = max(0, self._inflight - 1)
        self.busy = self._inflight > 0 and self.snapshot is None
        if self._again:
            self._again = False
            self.request_analysis()

    def current_view(self) -> View | None:
        return self.snapshot.view(self.selected) if self.snapshot is not None else None

    def overview_painted(self, whole: bool = True) -> None:
        """Called by the overview after the refresh that drew analysed figures; ``whole``: not a first look.
        The first call marks the first paint (``painted``), the first whole one ``whole``."""
        if self.snapshot is None or (self._painted and (not whole or "whole" in self.timings)):
            return
        now = time.time()
        if not self._painted:
            self._painted = True
            self.timings["painted"] = now
            self.post_message(self.OverviewReady())
        if whole:
            self.timings["whole"] = now
        if self._timings_path is not None:
            self._timings_path.write_text(json.dumps(self.timings))

    # -- groups -----------------------------------------------------------------------------
    def _group_choices(self) -> bool:
        """Whether ``g`` has anything to offer: a dataset's groups, or several live servers."""
        if isinstance(self.source, GroupedSource):
            return bool(self.source.groups())
        return self.source.live and self.snapshot is not None and len(self.snapshot.labels) > 1

    def _remember(self, snap: Snapshot) -> None:
        """Keep what the picker shows of each group analysed: its requests and bottleneck."""
        def stats(view: View) -> tuple[int | None, str | None]:
            return view.doc.get("requests"), view.doc.get("bottleneck")

        if not isinstance(self.source, GroupedSource):  # live: a group is a server, a view
            for label, view in snap.views.items():
                self._group_stats[label] = stats(view)
            return
        self._group_stats[snap.group or ALL] = stats(snap.view(ALL))
        for g in self.source.groups():  # a group of one trace is that trace's view, analysed already
            if len(g.labels) == 1 and g.labels[0] in snap.views:
                self._group_stats[g.name] = stats(snap.views[g.labels[0]])

    def group_rows(self) -> list[GroupRow]:
        """The picker's rows: ``all``, then each group (a live source: each server)."""
        def row(name: str, traces: int) -> GroupRow:
            requests, bottleneck = self._group_stats.get(name, (None, None))
            return GroupRow(name, traces, requests, bottleneck)

        if isinstance(self.source, GroupedSource):
            groups = self.source.groups()
            return [row(ALL, sum(len(g.labels) for g in groups)),
                    *(row(g.name, len(g.labels)) for g in groups)]
        labels = self.snapshot.labels if self.snapshot is not None else []
        return [row(ALL, len(labels) - 1), *(row(lab, 1) for lab in labels if lab != ALL)]

    def action_pick_group(self) -> None:
        if not self._group_choices() or isinstance(self.screen, GroupScreen):
            return
        if isinstance(self.source, GroupedSource):
            current, by = self.group or ALL, self.source.group_by
        else:
            current, by = self.selected or ALL, ["server"]
        self.push_screen(GroupScreen(self.group_rows(), current, by), self._group_picked)

    def _group_picked(self, name: str | None) -> None:
        if name is None:
            return
        if not isinstance(self.source, GroupedSource):  # live: a server is a view of the snapshot
            self.selected = None if name == ALL else name
            self.request_analysis()
            return
        group = None if name == ALL else name
        if group == self.group:
            return
        self.group = group
        self.selected = None
        self.request_analysis()

    # -- actions ----------------------------------------------------------------------------
    async def action_quit(self) -> None:
        """q: quit now. A first look being completed (seconds of DuckDB on a big trace) is interrupted: the
        app would otherwise wait for its worker."""
        completing = self._completing
        if completing is not None:
            for view in completing.views.values():
                if view.first_look:
                    view.analysis.interrupt()
        await super().action_quit()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_hypothesis(self) -> None:
        view = self.current_view()
        if view is None:
            self.notify("nothing analysed yet", severity="warning")
            return
        if view.first_look:
            self.notify("the verdicts come with each token's gap, being analysed: a moment", timeout=4)
            return
        if not isinstance(self.screen, HypothesisScreen):
            self.push_screen(HypothesisScreen(view))

    def action_next_trace(self) -> None:
        if self.snapshot is None or len(self.snapshot.labels) < 2:
            self.notify("one trace: nothing to switch", timeout=2)
            return
        labels = self.snapshot.labels
        current = self.selected if self.selected in labels else labels[0]
        following = labels[(labels.index(current) + 1) % len(labels)]
        if not self.source.live and following not in self.snapshot.views:
            self.notify("analysing each trace alone: a moment", timeout=2)
            return
        self.selected = following
        if self.source.live:  # a live snapshot holds the view it was asked for: analyse the new one now
            self.request_analysis()

    def action_reload(self) -> None:
        self.request_analysis(reload=True)

    def action_toggle_theme(self) -> None:
        self.theme = THEMES["light"] if self.theme == THEMES["dark"] else THEMES["dark"]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "window":  # sliding-window control: shown for live sources only
            return self.source.live
        if action == "pick_group":  # a dataset with key=value folders, or several live servers
            return self._group_choices()
        return super().check_action(action, parameters)

    def action_window(self) -> None:
        """Next sliding window of a live source (``tracetool attach``: 10 s, 30 s, 1 min, 5 min)."""
        described = self.source.cycle_window()
        if described is not None:
            self.notify(f"window: {described}", timeout=2)
            self.status_line = _status(self.source)
            self.request_analysis()


def _status(source: TraceSource) -> str:
    try:
        return source.status()
    except Exception as e:  # a status line must never take the viewer down
        return f"status unavailable ({type(e).__name__})"


__all__ = ["THEMES", "TraceApp"]
