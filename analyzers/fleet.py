"""``analyze_dataset()``: a tree of traces as one dataset, analysed overall and per group.

A group is the traces sharing the values of the ``--group-by`` keys (hive-style
folder names, :mod:`tracetool.dataset`). Each group is analysed exactly as
``analyze`` analyses those traces alone (the same modules over the same rows), so
its numbers equal a separate run's; a group of one trace reuses that trace's
analysis, and a group holding every trace reuses the overall one.

The JSON (docs/analysis-json.md) is ``analyze --json``'s document plus
``dataset`` (keys, grouping, unreadable traces) and ``groups`` (one entry per
group: the group's keys as fields, then the fields of a single-trace analysis).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from analyzers.analysis import MAX_PARALLEL, Analysis, check_usable, parallel_within
from analyzers.backend import Backend, open_backend
from analyzers.options import AnalysisOptions
from tracetool.dataset import (
    Dataset,
    Member,
    discover,
    engine_budget,
    group_keys,
    groups,
    open_members,
)
from tracetool.errors import BadInput, UsageError
from tracetool.reader import Trace

if TYPE_CHECKING:
    from tracetool.slo import SLO

_Job = TypeVar("_Job")

#: Fields of a group entry besides the analysis' own; a key may not take one of these names.
_GROUP_FIELDS = ("group", "traces", "paths")


@dataclass(eq=False)
class Group:
    """One group of a dataset: its key values, its members and their analysis."""

    keys: dict[str, str | None]
    members: list[Member]
    analysis: Analysis


@dataclass(eq=False)
class DatasetAnalysis:
    """:func:`analyze_dataset`'s result: the overall analysis, the groups, what was set aside.

    With several traces, each trace's own analysis (``analysis.traces``) keeps its summary tables
    (and so its JSON) but not its DuckDB connection (:meth:`Analysis.release`): query the overall
    analysis, or analyse the trace alone."""

    dataset: Dataset
    analysis: Analysis
    group_by: list[str]
    groups: list[Group] = field(default_factory=list)
    members: list[Member] = field(default_factory=list)
    bad: list[tuple[Member, str]] = field(default_factory=list)
    engine: str = "duckdb"
    #: Whether each trace was also analysed alone (:attr:`Backend.per_trace`): the ``traces`` entries.
    per_trace: bool = True

    @property
    def warnings(self) -> list[str]:
        """The readers' warnings, then one line per trace set aside."""
        return [*self.analysis.warnings, *(f"{m.path}: skipped: {why}" for m, why in self.bad)]

    def slo(self, spec: SLO) -> dict[str, Any]:
        """The overall analysis' goodput and attainment of ``spec`` (:meth:`Analysis.slo`)."""
        return self.analysis.slo(spec)

    def to_json(self) -> dict[str, Any]:
        doc = self.analysis.to_json()
        doc["sql_engine"] = self.engine
        if not self.per_trace:  # the whole and the groups were analysed, not each trace alone (Spark)
            doc["traces"] = [{"trace": m.label, "path": str(m.path)} for m in self.members]
        keyed = {m.label: dict(m.keys) for m in self.members}
        for t in doc["traces"]:
            t["keys"] = keyed.get(t["trace"], {})
        doc["warnings"] = self.warnings
        doc["dataset"] = {
            "keys": list(self.dataset.keys),
            "group_by": list(self.group_by),
            "traces": len(self.members),
            "bad_traces": [{"path": str(m.path), "error": why} for m, why in self.bad],
        }
        doc["groups"] = [{**g.keys, "group": dict(g.keys), "traces": [m.label for m in g.members],
                          "paths": [str(m.path) for m in g.members], **g.analysis._body()}
                         for g in self.groups]
        return doc


def analyze_dataset(paths: Sequence[str | os.PathLike[str]], options: AnalysisOptions | None = None, *,
                    group_by: Sequence[str] | None = None) -> DatasetAnalysis:
    """Analyse the traces under ``paths`` overall, each alone, and per group.

    Args:
        paths: traces, or directory trees of traces (a dataset).
        options: the analysis options (:class:`~analyzers.options.AnalysisOptions`). Its
            ``memory_limit`` is what the whole process may hold (None: no limit, DuckDB's
            default): DuckDB is given what is left of it once the traces are opened, less a
            reserve for Python (:func:`tracetool.dataset.engine_budget`), and spills to disk past
            that. Parquet tables are read lazily, by DuckDB's own reader (:mod:`tracetool.lazy`),
            so the analysis runs in bounded memory whatever the dataset's size. Its ``engine``
            (:mod:`analyzers.backend`) is ``duckdb``, or ``spark``: the overall analysis and each
            group's run on Spark SQL, and ``traces`` lists the traces without analysing each alone.
        group_by: key names to group by (default: the outermost key, if the folders give any).

    Raises:
        BadInput: no readable trace; mixed trace versions; an explicitly named trace unreadable.
        UsageError: an unknown ``--group-by`` key, or a key named like a group field.
    """
    ds = discover(paths)
    keys = group_keys(ds, group_by)
    _check_keys(keys)
    opened = open_members(ds, lazy=True)
    return _analyze_opened(ds, keys, opened.traces, opened.bad, options or AnalysisOptions())


def analyze_keyed(traces: Sequence[tuple[Member, Trace]], options: AnalysisOptions | None = None, *,
                  bad: Sequence[tuple[Member, str]] = (), group_by: Sequence[str] | None = None) -> DatasetAnalysis:
    """Traces already opened, each with its :class:`Member` (label and keys), analysed exactly as
    :func:`analyze_dataset` analyses a dataset: overall, each alone, and per group (on DuckDB).

    A live fleet (``tracetool attach ADDR... --json --duration S``) is such a set: one window per
    server, keyed ``server``, so its document has the shape of ``analyze --json`` on a dataset
    recorded as ``DIR/server=HOST:PORT/``. ``bad`` are the members that gave nothing, with why
    (the document's ``dataset.bad_traces``).

    Raises:
        BadInput: no trace.
        UsageError: an unknown ``group_by`` key, or a key named like a group field.
    """
    if not traces:
        raise BadInput(f"nothing to analyse ({_reasons(bad) or 'none given'})")
    members = [m for m, _ in traces]
    names: list[str] = []
    for m in [*members, *(m for m, _ in bad)]:
        names += [k for k, _ in m.keys if k not in names]
    ds = Dataset([*members, *(m for m, _ in bad)], names, is_tree=True)
    keys = group_keys(ds, group_by)
    _check_keys(keys)
    return _analyze_opened(ds, keys, list(traces), list(bad), options or AnalysisOptions())


def _check_keys(keys: Sequence[str]) -> None:
    for k in keys:
        if k in _GROUP_FIELDS:
            raise UsageError(f"--group-by {k}: the name of a field of every group entry; rename the folders")


#: An error about many traces names this many of them, then how many more.
NAMED_IN_ERRORS = 3


def _reasons(bad: Sequence[tuple[Member, str]]) -> str:
    """``label: reason`` of the first :data:`NAMED_IN_ERRORS` members set aside, then the count of the rest."""
    said = "; ".join(f"{m.label}: {r}" for m, r in bad[:NAMED_IN_ERRORS])
    return said + (f"; and {len(bad) - NAMED_IN_ERRORS} more" if len(bad) > NAMED_IN_ERRORS else "")


def _analyze_opened(ds: Dataset, keys: list[str], opened: list[tuple[Member, Trace]], bad: list[tuple[Member, str]],
                    options: AnalysisOptions) -> DatasetAnalysis:
    """The overall, per-trace and per-group analyses of opened traces (both entry points above).

    In a tree, a trace with no request to analyse (an empty recording: a server that was not
    reachable) is set aside like an unreadable one, with its reason. The engine is opened once
    (:func:`analyzers.backend.open_backend`) and runs every analysis.
    """
    if ds.is_tree:
        usable = []
        for m, t in opened:
            try:
                check_usable(t)
                usable.append((m, t))
            except BadInput as e:
                bad = [*bad, (m, str(e).removeprefix(f"{t.path}: "))]
        if not usable:
            raise BadInput(bad[0][1] if len(bad) == 1 else f"no trace to analyse among {len(bad)}: {bad[0][1]}")
        opened = usable
    else:
        for _, t in opened:
            check_usable(t)
    members = [m for m, _ in opened]
    traces = [t for _, t in opened]
    memory_limit = options.memory_limit
    if memory_limit is not None:  # what DuckDB may hold, the traces being open: the rest is Python's
        memory_limit = engine_budget(memory_limit)
    labels = _labels(members)
    members = [Member(m.path, lab, m.keys) for m, lab in zip(members, labels, strict=True)]
    backend = open_backend(options)
    overall = backend.run(traces, labels, labels[0] if len(traces) == 1 else "all", memory_limit=memory_limit)
    overall.traces = [overall] if len(traces) == 1 else []
    if backend.per_trace and len(traces) > 1:
        overall.traces = _each_alone(backend, traces, labels, memory_limit)
    by_label = {t.label: t for t in overall.traces}
    index = {m.label: i for i, m in enumerate(members)}
    out = DatasetAnalysis(ds, overall, keys, members=members, bad=bad, engine=backend.name,
                          per_trace=backend.per_trace)
    todo: list[tuple[dict[str, str | None], list[Member]]] = []
    for vals, ms in (groups(members, keys) if keys else []):
        if len(ms) == 1 and ms[0].label in by_label:
            out.groups.append(Group(vals, ms, by_label[ms[0].label]))
        elif len(ms) == len(members):
            out.groups.append(Group(vals, ms, overall))
        else:
            out.groups.append(Group(vals, ms, overall))  # placeholder, replaced below
            todo.append((vals, ms))
    if todo:
        def run(job: tuple[dict[str, str | None], list[Member]], share: int | None) -> Analysis:
            ms = job[1]
            return backend.run([traces[index[m.label]] for m in ms], [m.label for m in ms], "all",
                               memory_limit=share)

        done = dict(zip((id(j[1]) for j in todo), _side_by_side(run, todo, memory_limit, backend), strict=True))
        for g in out.groups:
            if id(g.members) in done:
                g.analysis = done[id(g.members)]
    return out


def _each_alone(backend: Backend, traces: list[Trace], labels: list[str], memory_limit: int | None) -> list[Analysis]:
    """Each trace's own analysis. Only their tables are kept: the connection of each is closed once
    they are collected, so a dataset of thousands of traces does not hold thousands of databases."""
    def run(i: int, share: int | None) -> Analysis:
        a = backend.run([traces[i]], [labels[i]], labels[i], memory_limit=share)
        a.traces = [a]
        a.release()
        return a

    return _side_by_side(run, list(range(len(traces))), memory_limit, backend)


def _side_by_side(fn: Callable[[_Job, int | None], Analysis], jobs: list[_Job], memory_limit: int | None,
                  backend: Backend) -> list[Analysis]:
    """``fn(job, memory share)`` for every job, in order: DuckDB's on a few threads (its connections
    release the GIL while they plan and run), sharing ``memory_limit``; Spark's one at a time (the
    cluster runs each in parallel)."""
    workers = min(len(jobs), MAX_PARALLEL, parallel_within(memory_limit)) if backend.per_trace else 1
    share = None if memory_limit is None else memory_limit // workers
    if workers == 1:
        return [fn(j, share) for j in jobs]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tracetool-dataset") as ex:
        return list(ex.map(lambda j: fn(j, share), jobs))


def _labels(members: Sequence[Member]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for m in members:
        n = seen.get(m.label, 0)
        seen[m.label] = n + 1
        out.append(m.label if n == 0 else f"{m.label}#{n + 1}")
    return out


__all__ = ["DatasetAnalysis", "Group", "analyze_dataset", "analyze_keyed"]
