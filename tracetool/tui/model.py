"""What the screens show: one analysis of a source's snapshot, and the views into it.

The app never computes figures itself. A snapshot of the source goes through
:func:`analyzers.analyze` once (in a worker thread); :class:`Snapshot` keeps
the :class:`~analyzers.Analysis` with its ``--json`` document, per trace and
combined, and the screens render :class:`View` objects from it. Every story
the viewer can test is asked for up front (``claims=`` every claim key), so
the hypothesis key reads a verdict the analyzer already gave instead of
running the analysis again.

No textual here: this module is tested, and used by the benchmark, headless.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from analyzers.options import AnalysisOptions

if TYPE_CHECKING:
    from analyzers import Analysis
    from tracetool.trace_source import TraceSource

#: The label of the view that holds every trace together.
ALL = "all"
#: From this many tokens (a source's, together), a recording's first paint is a first look
#: (``analyzers.analyze(first_look=True)``): the requests' figures, then each token's gap. At 10M tokens the
#: first look is about a third of the whole analysis; below this, the whole one comes within a second or two.
FIRST_LOOK_TOKENS = 2_000_000


@dataclass(frozen=True)
class View:
    """One analysis a screen renders: all traces together, or one of them.

    ``lock`` serialises SQL on the analysis's DuckDB connection: the trace tables
    are registered on that connection only (a cursor does not see them), and a
    connection serves one thread at a time.     """

    label: str
    analysis: Analysis
    doc: dict[str, Any]
    lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @property
    def first_look(self) -> bool:
        """A first look (:attr:`analyzers.Analysis.first_look`): the request-level figures are the whole
        analysis's; ITL, the step accounting, findings and verdicts come with :func:`complete`."""
        return self.analysis.first_look

    def claim(self, key: str, scope: str | None = None) -> dict[str, Any] | None:
        """The analyzer's verdict row (``claims`` table) for a claim key, about the mean request or, with a
        ``scope`` (``p99-ttft``), about that tail."""
        return next((r for r in self.analysis.rows("claims") if r["key"] == key and r["scope"] == scope), None)


@dataclass
class Snapshot:
    """An analysed snapshot of a source.

    Attributes:
        views: label -> view; ``"all"`` first when there are several traces.
        generation: increases with every snapshot the app receives.
        status: the source's status line when the snapshot was taken.
        elapsed_s: time spent reading and analysing, seconds.
        timings: phase -> seconds (``snapshot``, ``analyze``, ``json``).
        choices: every view the source offers (``"all"`` and each trace), analysed or not: a
            live snapshot analyses only the view shown (see :func:`analyse`).
        group: the dataset group analysed (its name, ``server=a``), None for every trace.
    """

    views: dict[str, View]
    generation: int
    status: str
    source_label: str
    elapsed_s: float
    timings: dict[str, float] = field(default_factory=dict)
    choices: list[str] | None = None
    group: str | None = None

    @property
    def labels(self) -> list[str]:
        return list(self.choices) if self.choices else list(self.views)

    @property
    def first_look(self) -> bool:
        """Whether a view is a first look (:func:`complete` makes the snapshot whole)."""
        return any(v.first_look for v in self.views.values())

    def view(self, label: str | None) -> View:
        """The view called ``label``, or the first one when it is gone (a live server dropped out)."""
        if label is not None and label in self.views:
            return self.views[label]
        return next(iter(self.views.values()))


def story_keys(tail: bool = True) -> list[str]:
    """Every claim key the analyzer knows, in its catalogue's order, then (``tail``) every claim about a tail:
    a live view's sessions leave the tail out (analyzers.connection.Session)."""
    from analyzers import CLAIMS
    from analyzers.params import tail_claims

    return [*CLAIMS, *(tail_claims() if tail else [])]


class Sessions:
    """The analyzer sessions of a live viewer (:class:`analyzers.connection.Session`).

    A live tick analyses the view on screen again and again: each analysis in flight takes a
    free session (a DuckDB connection kept from an earlier tick with every analyzer object in
    it) and gives it back when done, so a tick swaps the data instead of building the
    connection anew. At most ``keep`` idle sessions are kept.
    """

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self._free: list[Any] = []
        self._made: list[Any] = []
        self._lock = threading.Lock()

    @property
    def reused(self) -> int:
        """Analyses that reused a connection, over the sessions kept (the others opened one)."""
        return sum(s.reused for s in self._made)

    @contextmanager
    def take(self) -> Iterator[Any]:
        from analyzers.connection import Session

        with self._lock:
            if self._free:
                session = self._free.pop()
            else:
                session = Session(tail=False)  # a live tick: the tail is analysed on a recording
                self._made.append(session)
        try:
            yield session
        finally:
            with self._lock:
                if len(self._free) < self.keep:
                    self._free.append(session)
                    session = None
            if session is not None:  # more in flight than kept: this one goes
                with self._lock:
                    self._made.remove(session)
                with session.lock:
                    session.close()

    def close(self) -> None:
        with self._lock:
            free, self._free = self._free, []
        for session in free:
            with session.lock:
                session.close()


def analyse(source: TraceSource, options: AnalysisOptions, generation: int = 0,
            only: str | None = None, sessions: Sessions | None = None,
            group: str | None = None, behind: bool = False,
            cancelled: Callable[[], bool] | None = None, first_look: bool = False,
            together: Analysis | None = None) -> Snapshot | None:
    """Take a snapshot of ``source`` and analyse it; None when a live source has no data yet.

    ``only``: with several traces, analyse just this view (``"all"`` or a trace label; None:
    every view). A live viewer passes the view it shows, so a tick costs one analysis instead of
    one per server plus the combined one; the others are analysed when the viewer switches.
    ``sessions``: a live viewer's :class:`Sessions`; the one analysis of an ``only`` tick (or of
    a single trace) reuses a connection from it. ``behind``: something is on screen already (the
    traces' analysis together, painted first): the traces' own analyses run one at a time, so
    drawing and keys keep a core, and stop between two when ``cancelled()`` says so (the viewer
    quit or moved on: None is returned), so quitting waits for one small analysis at most.
    ``together``: the analysis of every trace together, made already (the first paint's); ``behind``
    then analyses only each trace alone. ``first_look``: a static source of :data:`FIRST_LOOK_TOKENS`
    or more analysed as one analysis (one trace, or ``only=ALL``) gets a first look
    (:attr:`View.first_look`; :func:`complete` finishes it).

    Raises:
        BadInput: the traces cannot be analysed (no requests, unreadable).
        UsageError: an unknown ``--model`` or ``--gpu`` preset.
    """
    t0 = time.perf_counter()
    # a dataset source labels its traces by their path under the dataset (as analyze does) and
    # can give one group's traces; any other source gives a snapshot of every trace
    from tracetool.trace_source import GroupedSource

    labels: list[str] | None = None
    if isinstance(source, GroupedSource):
        pairs = source.labelled(group)
        traces, labels = [t for _, t in pairs], [lab for lab, _ in pairs]
        source_label = source.describe(group)
    else:
        traces, source_label = source.snapshot(), source.label
    status = source.status()
    if not traces:
        return None
    t1 = time.perf_counter()
    import analyzers

    # every story the viewer can test, asked for up front (the hypothesis key reads its verdict)
    opts = AnalysisOptions.of(options, claims=story_keys(tail=sessions is None))
    look = first_look and sessions is None and sum(t.rows("tokens") for t in traces) >= FIRST_LOOK_TOKENS
    choices = None
    views: dict[str, View] = {}
    with sessions.take() if sessions is not None else nullcontext() as session:
        if only is not None and len(traces) > 1:
            from analyzers.connection import labels_for

            labels = labels or labels_for(traces)
            choices = [ALL, *labels]
            if only in labels:
                a = analyzers.analyze(traces[labels.index(only)], opts, session=session)
                a.label = only  # alone, labels_for would drop a '#2' the combined list gives
            else:
                a = analyzers.analyze(traces, opts, per_trace=False, session=session, labels=labels,
                                      first_look=look)
            t2 = time.perf_counter()
            views[a.label] = View(a.label, a, a.to_json(), lock=a._lock)
        else:
            if behind and len(traces) > 1:
                from analyzers.connection import labels_for

                labels = labels or labels_for(traces)
                a = together or analyzers.analyze(traces, opts, per_trace=False, labels=labels)
                a.traces = []
                for trace, lab in zip(traces, labels, strict=True):
                    if cancelled is not None and cancelled():
                        return None
                    one = analyzers.analyze(trace, opts, labels=[lab])
                    one.traces = []  # as analyze's per-trace analyses of several: no list of itself
                    a.traces.append(one)
            else:  # one analysis: reused
                a = analyzers.analyze(traces, opts, session=session, labels=labels,
                                      first_look=look and len(traces) == 1)
            t2 = time.perf_counter()
            if len(a.traces) > 1:
                views[ALL] = View(ALL, a, a.to_json(), lock=a._lock)
            for t in a.traces:  # one trace: a.traces == [a], a single view
                views[t.label] = View(t.label, t, t.to_json(), lock=t._lock)
    t3 = time.perf_counter()
    return Snapshot(views=views, generation=generation, status=status, source_label=source_label,
                    elapsed_s=t3 - t0, timings={"snapshot": t1 - t0, "analyze": t2 - t1, "json": t3 - t2},
                    choices=choices, group=group)


def complete(first: Snapshot, generation: int, status: str) -> Snapshot:
    """``first`` with each first look made whole (:meth:`analyzers.Analysis.complete`, on its connection).

    Raises:
        BadInput: the traces' values break an analyzer the first look did not run."""
    t0 = time.perf_counter()
    views = {}
    for label, v in first.views.items():
        whole = v.analysis.complete()
        views[label] = View(label, whole, whole.to_json(), lock=whole._lock) if whole is not v.analysis else v
    t1 = time.perf_counter()
    return Snapshot(views=views, generation=generation, status=status, source_label=first.source_label,
                    elapsed_s=first.elapsed_s + t1 - t0, timings={**first.timings, "complete": t1 - t0},
                    choices=first.choices, group=first.group)


__all__ = ["ALL", "FIRST_LOOK_TOKENS", "Sessions", "Snapshot", "View", "analyse", "complete", "story_keys"]
