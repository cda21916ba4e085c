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
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from analyzers.analysis import MAX_PARALLEL, Analysis, analyze, check_usable, parallel_within
from analyzers.params import ClaimSpec, Thresholds
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
    """:func:`analyze_dataset`'s result: the overall analysis, the groups, what was set aside."""

    dataset: Dataset
    analysis: Analysis
    group_by: list[str]
    groups: list[Group] = field(default_factory=list)
    members: list[Member] = field(default_factory=list)
    bad: list[tuple[Member, str]] = field(default_factory=list)
    engine: str = "duckdb"

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
        if self.engine == "spark":  # Spark analyses the whole and the groups, not each trace alone
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


def analyze_dataset(paths: Sequence[str | os.PathLike[str]], *, group_by: Sequence[str] | None = None,
                    model: str | None = None, gpu: str | None = None, gpus: int | None = None,
                    weight_dtype: str | None = None, kv_dtype: str | None = None,
                    claims: Sequence[str | ClaimSpec] = (), thresholds: Thresholds | None = None,
                    memory_limit: int | None = None, engine: str = "duckdb",
                    spark_master: str | None = None) -> DatasetAnalysis:
    """Analyse the traces under ``paths`` overall, each alone, and per group.

    Args:
        paths: traces, or directory trees of traces (a dataset).
        group_by: key names to group by (default: the outermost key, if the folders give any).
        model, gpu, gpus, weight_dtype, kv_dtype, claims, thresholds: as :func:`analyzers.analyze`.
        memory_limit: bytes the whole process may hold (None: no limit, DuckDB's default). DuckDB
            is given what is left of it once the traces are opened, less a reserve for Python
            (:func:`tracetool.dataset.engine_budget`), and spills to disk past that. Parquet tables
            are read lazily, by DuckDB's own reader (:mod:`tracetool.lazy`), so the analysis runs
            in bounded memory whatever the dataset's size.
        engine: ``duckdb``, or ``spark`` (:mod:`analyzers.spark_engine`: the overall analysis and
            each group's run on Spark SQL; ``traces`` then lists the traces without analysing
            each alone).
        spark_master: the Spark master URL (default ``local[*]``).

    Raises:
        BadInput: no readable trace; mixed trace versions; an explicitly named trace unreadable.
        UsageError: an unknown ``--group-by`` key, or a key named like a group field.
    """
    ds = discover(paths)
    keys = group_keys(ds, group_by)
    _check_keys(keys)
    opened = open_members(ds, lazy=True)
    return _analyze_opened(ds, keys, opened.traces, opened.bad, model=model, gpu=gpu, gpus=gpus,
                           weight_dtype=weight_dtype, kv_dtype=kv_dtype, claims=claims, thresholds=thresholds,
                           memory_limit=memory_limit, engine=engine, spark_master=spark_master)


def analyze_keyed(traces: Sequence[tuple[Member, Trace]], *, bad: Sequence[tuple[Member, str]] = (),
                  group_by: Sequence[str] | None = None, model: str | None = None, gpu: str | None = None,
                  gpus: int | None = None, weight_dtype: str | None = None, kv_dtype: str | None = None,
                  claims: Sequence[str | ClaimSpec] = (), thresholds: Thresholds | None = None,
                  memory_limit: int | None = None) -> DatasetAnalysis:
    """Traces already opened, each with its :class:`Member` (label and keys), analysed exactly as
    :func:`analyze_dataset` analyses a dataset: overall, each alone, and per group.

    A live fleet (``tracetool attach ADDR... --json --duration S``) is such a set: one window per
    server, keyed ``server``, so its document has the shape of ``analyze --json`` on a dataset
    recorded as ``DIR/server=HOST:PORT/``. ``bad`` are the members that gave nothing, with why
    (the document's ``dataset.bad_traces``).

    Raises:
        BadInput: no trace.
        UsageError: an unknown ``group_by`` key, or a key named like a group field.
    """
    if not traces:
        why = "; ".join(f"{m.label}: {r}" for m, r in bad) or "none given"
        raise BadInput(f"nothing to analyse ({why})")
    members = [m for m, _ in traces]
    names: list[str] = []
    for m in [*members, *(m for m, _ in bad)]:
        names += [k for k, _ in m.keys if k not in names]
    ds = Dataset([*members, *(m for m, _ in bad)], names, is_tree=True)
    keys = group_keys(ds, group_by)
    _check_keys(keys)
    return _analyze_opened(ds, keys, list(traces), list(bad), model=model, gpu=gpu, gpus=gpus,
                           weight_dtype=weight_dtype, kv_dtype=kv_dtype, claims=claims, thresholds=thresholds,
                           memory_limit=memory_limit)


def _check_keys(keys: Sequence[str]) -> None:
    for k in keys:
        if k in _GROUP_FIELDS:
            raise UsageError(f"--group-by {k}: the name of a field of every group entry; rename the folders")


def _analyze_opened(ds: Dataset, keys: list[str], opened: list[tuple[Member, Trace]], bad: list[tuple[Member, str]],
                    *, model: str | None, gpu: str | None, gpus: int | None, weight_dtype: str | None,
                    kv_dtype: str | None, claims: Sequence[str | ClaimSpec], thresholds: Thresholds | None,
                    memory_limit: int | None, engine: str = "duckdb",
                    spark_master: str | None = None) -> DatasetAnalysis:
    """The overall, per-trace and per-group analyses of opened traces (both entry points above).

    In a tree, a trace with no request to analyse (an empty recording: a server that was not
    reachable) is set aside like an unreadable one, with its reason.
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
    members = [m for m, _ in opened]
    traces = [t for _, t in opened]
    if memory_limit is not None:  # what DuckDB may hold, the traces being open: the rest is Python's
        memory_limit = engine_budget(memory_limit)
    labels = _labels(members)
    members = [Member(m.path, lab, m.keys) for m, lab in zip(members, labels, strict=True)]
    common: dict[str, Any] = {"model": model, "gpu": gpu, "gpus": gpus, "weight_dtype": weight_dtype,
                              "kv_dtype": kv_dtype, "claims": claims, "thresholds": thresholds}
    if engine == "spark":
        return _on_spark(ds, keys, members, bad, traces, labels, spark_master, common)
    if engine != "duckdb":
        raise UsageError(f"--engine {engine}: unknown (duckdb or spark)")
    overall = analyze(traces, labels=labels, memory_limit=memory_limit, **common)
    by_label = {t.label: t for t in overall.traces}
    index = {m.label: i for i, m in enumerate(members)}
    out = DatasetAnalysis(ds, overall, keys, members=members, bad=bad)
    todo: list[tuple[dict[str, str | None], list[Member]]] = []
    for vals, ms in (groups(members, keys) if keys else []):
        if len(ms) == 1:
            out.groups.append(Group(vals, ms, by_label[ms[0].label]))
        elif len(ms) == len(members):
            out.groups.append(Group(vals, ms, overall))
        else:
            out.groups.append(Group(vals, ms, overall))  # placeholder, replaced below
            todo.append((vals, ms))
    if todo:
        def run(job: tuple[dict[str, str | None], list[Member]]) -> Analysis:
            ms = job[1]
            return analyze([traces[index[m.label]] for m in ms], labels=[m.label for m in ms],
                           per_trace=False, memory_limit=share, **common)

        workers = min(len(todo), MAX_PARALLEL, parallel_within(memory_limit))
        share = None if memory_limit is None else memory_limit // workers
        with ThreadPoolExecutor(max_workers=workers,
                                thread_name_prefix="tracetool-groups") as ex:
            done = dict(zip((id(j[1]) for j in todo), ex.map(run, todo), strict=True))
        for g in out.groups:
            if id(g.members) in done:
                g.analysis = done[id(g.members)]
    return out


def _on_spark(ds: Dataset, keys: list[str], members: list[Member], bad: list[tuple[Member, str]],
              traces: list[Any], labels: list[str], master: str | None, common: dict[str, Any]) -> DatasetAnalysis:
    from analyzers import spark_engine
    from analyzers.params import parse_claim, roofline_inputs

    spark = spark_engine.session(master)
    specs = [c if isinstance(c, ClaimSpec) else parse_claim(c) for c in common["claims"]]
    th = common["thresholds"] or Thresholds()
    roof = [roofline_inputs(t.meta, model=common["model"], gpu=common["gpu"], gpus=common["gpus"],
                            weight_dtype=common["weight_dtype"], kv_dtype=common["kv_dtype"]) for t in traces]
    index = {m.label: i for i, m in enumerate(members)}

    def run(ms: list[Member], label: str) -> Analysis:
        idx = [index[m.label] for m in ms]
        return spark_engine.run(spark, [traces[i] for i in idx], [labels[i] for i in idx], [roof[i] for i in idx],
                                th, specs, label)

    overall = run(members, labels[0] if len(members) == 1 else "all")
    out = DatasetAnalysis(ds, overall, keys, members=members, bad=bad, engine="spark")
    for vals, ms in (groups(members, keys) if keys else []):
        out.groups.append(Group(vals, ms, overall if len(ms) == len(members) else run(ms, "group")))
    return out


def _labels(members: Sequence[Member]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for m in members:
        n = seen.get(m.label, 0)
        seen[m.label] = n + 1
        out.append(m.label if n == 0 else f"{m.label}#{n + 1}")
    return out


__all__ = ["DatasetAnalysis", "Group", "analyze_dataset", "analyze_keyed"]
