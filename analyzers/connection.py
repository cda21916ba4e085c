"""A DuckDB connection holding the traces, the parameters and every analyzer object.

``connect(traces)`` is the one factory the CLI, the TUI's SQL console and the
report share:

* each trace's tables are registered zero-copy from Arrow as ``_t<i>_<table>``;
* views ``spans``, ``tokens``, ``gpu``, ``stacks``, ``steps``, ``requests`` union
  the traces' canonical columns and add a ``trace`` column (the trace's label),
  so request ids never collide across traces;
* parameter tables ``_traces``, ``_hardware``, ``_thresholds`` and ``_claims``
  hold what Python resolved (labels, roofline inputs, thresholds, claims);
* external access (files, network, extensions) is then switched off and the SQL
  modules run in order (``analyzers.modules.MODULES``).

Summary objects are temp tables computed once here; per-token objects stay views.

A :class:`Session` keeps one such connection for successive snapshots of the same traces (a
live view re-analysing its sources several times a second) and only swaps the data.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import astuple, fields
from pathlib import Path

import duckdb

from analyzers.modules import (
    DISABLED_OPTIMIZERS,
    SMALL_DISABLED_OPTIMIZERS,
    TEMP_TABLE_RE,
    gap_objects,
    run_all,
    tail_tables,
)
from analyzers.modules import script as modules_script
from analyzers.params import ClaimSpec, RooflineInputs, Thresholds
from tracetool.errors import BadInput
from tracetool.lazy import files as lazy_files
from tracetool.reader import Trace, find_traces, open_trace
from tracetool.schema import TABLES

TraceArg = Trace | str | os.PathLike[str]


def load_traces(traces: TraceArg | Iterable[TraceArg]) -> list[Trace]:
    """Open paths (a trace, or a directory of traces) and keep Trace objects as they are."""
    items: list[TraceArg] = [traces] if isinstance(traces, (Trace, str, os.PathLike)) else list(traces)
    out: list[Trace] = []
    for item in items:
        if isinstance(item, Trace):
            out.append(item)
        else:
            out.extend(open_trace(p) for p in find_traces([item]))
    if not out:
        raise BadInput("no trace given")
    return out


def labels_for(traces: Sequence[Trace]) -> list[str]:
    """A unique, readable label per trace: its directory name, suffixed when names repeat."""
    seen: dict[str, int] = {}
    out = []
    for t in traces:
        base = t.name or str(t.path)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.append(base if n == 0 else f"{base}#{n + 1}")
    return out


#: Below this many rows (all tables of all traces), an analysis runs on one DuckDB thread.
#: Planning, not scanning, is most of a small analysis, and DuckDB's workers there cost more
#: CPU than they save time (50k tokens: 0.33 s wall and 0.37 s CPU on two threads, 0.27 s and
#: 0.28 s on one); a live view analyses two windows at once, so CPU is what its rate is made of.
#: From about this size the parallel scans and windows pay (200k: 0.47 s vs 0.52 s; 1M: 0.62 vs 0.78).
SINGLE_THREAD_ROWS = 100_000


def is_small(traces: Sequence[Trace]) -> bool:
    """Fewer than :data:`SINGLE_THREAD_ROWS` rows in all: one thread, fewer optimizer passes."""
    return sum(t.rows(name) for t in traces for name in t.table_names()) < SINGLE_THREAD_ROWS


#: The exact per-token ITL percentiles take 8 bytes per token in memory (quantile_cont's state); past
#: this share of a memory limit they are computed from a table DuckDB spills instead (analyzers/tokens.sql,
#: flag ``spill_quantiles``), at the cost of a second ordered pass over the tokens: with 2 GB, from about
#: 27M tokens; with the CLI's default limit (half of a 24 GB machine's memory), from about 150M.
QUANTILE_MEMORY_SHARE = 0.1
#: Bytes per token of the in-memory exact quantile.
QUANTILE_BYTES_PER_TOKEN = 8


def spill_quantiles(traces: Sequence[Trace], memory_limit: int | None) -> bool:
    """Whether the exact ITL percentiles take the spilled path (see :data:`QUANTILE_MEMORY_SHARE`)."""
    if memory_limit is None:
        return False
    tokens = sum(t.rows("tokens") for t in traces)
    return QUANTILE_BYTES_PER_TOKEN * tokens > QUANTILE_MEMORY_SHARE * memory_limit


def connect(traces: Sequence[Trace], *, roofline: Sequence[RooflineInputs] | None = None,
            thresholds: Thresholds | None = None, claims: Sequence[ClaimSpec] = (),
            labels: Sequence[str] | None = None, memory_limit: int | None = None,
            spill: bool | None = None, first_look: bool = False) -> duckdb.DuckDBPyConnection:
    """Register ``traces`` and run every analyzer module; returns the connection.

    Args:
        traces: opened traces (see :func:`load_traces`).
        roofline: one :class:`RooflineInputs` per trace (default: from each meta.json).
        thresholds: finding and claim thresholds (default: :class:`Thresholds()`).
        claims: claims to give verdicts on (see :func:`analyzers.params.parse_claim`).
        labels: trace labels (default: :func:`labels_for`).
        memory_limit: bytes DuckDB may hold (default: DuckDB's own, most of RAM); past it,
            sorts, joins and windows spill to a temporary directory (:func:`spill_directory`).
        spill: compute the exact ITL percentiles from a spilled table (True) or in memory (False);
            default: decided from the tokens and the memory limit (:func:`spill_quantiles`).
        first_look: leave out the ordered pass over each request's tokens (module flags ``no_gaps``
            and ``no_tail``): the request-level figures only, in a fraction of a big trace's time;
            :func:`complete` makes it the whole analysis, on the same connection.

    The connection has external access disabled. The trace tables are registered on
    this connection only (a ``con.cursor()`` does not see them), and a connection is
    not thread-safe: use it from one thread at a time (``Analysis.query`` holds a lock).
    """
    return _open(traces, roofline=roofline, thresholds=thresholds, claims=claims, labels=labels,
                 memory_limit=memory_limit, spill=spill, gaps=not first_look)[0]


def complete(con: duckdb.DuckDBPyConnection, traces: Sequence[Trace], memory_limit: int | None = None,
             spill: bool | None = None) -> None:
    """Make a first look (``connect(first_look=True)`` with the same traces, limit and ``spill``) the whole
    analysis: :data:`~analyzers.modules.GAPS_VIEW` and every object read from it made again, with the gaps
    (:func:`~analyzers.modules.gap_objects`). The others do not read them, and stay as they are."""
    flags = _flags(traces, memory_limit, spill)
    run_all(con, _disabled(is_small(traces)), flags, only=gap_objects(flags))


def _flags(traces: Sequence[Trace], memory_limit: int | None, spill: bool | None, *, tail: bool = True,
           gaps: bool = True) -> frozenset[str]:
    """The module flags (:data:`analyzers.modules.FLAGS`) of an analysis of ``traces``."""
    flags = {"spill_quantiles"} if (spill_quantiles(traces, memory_limit) if spill is None else spill) else set()
    if not tail:
        flags.add("no_tail")
    if not gaps:  # a first look: the tail reads the gaps (its tables are made when the look is completed)
        flags |= {"no_gaps", "no_tail"}
    return frozenset(flags)


_spill_dir: str | None = None


def spill_directory() -> str:
    """One private temporary directory per process where DuckDB spills past its memory limit,
    removed at exit (DuckDB deletes its files in it as it goes)."""
    global _spill_dir
    if _spill_dir is None:
        import atexit
        import shutil
        import tempfile

        _spill_dir = tempfile.mkdtemp(prefix="tracetool-spill-")
        atexit.register(shutil.rmtree, _spill_dir, True)
    return _spill_dir


def _open(traces: Sequence[Trace], *, roofline: Sequence[RooflineInputs] | None, thresholds: Thresholds | None,
          claims: Sequence[ClaimSpec], labels: Sequence[str] | None,
          memory_limit: int | None = None, spill: bool | None = None,
          tail: bool = True, gaps: bool = True) -> tuple[duckdb.DuckDBPyConnection, set[str]]:
    """:func:`connect`, and the names the traces' tables were registered under; without ``tail`` the tail's
    data tables are made empty (``Session(tail=False)``), without ``gaps`` the token gaps (a first look)."""
    from analyzers.params import roofline_inputs

    labels = list(labels) if labels is not None else labels_for(traces)
    roof = list(roofline) if roofline is not None else [roofline_inputs(t.meta) for t in traces]
    small = is_small(traces)  # one DuckDB thread and fewer optimizer passes
    config: dict[str, object] = {"threads": 1} if small else {}
    if memory_limit is not None:
        config.update(memory_limit=f"{max(memory_limit // 2**20, 16)}MiB", temp_directory=spill_directory())
    con = duckdb.connect(":memory:", config=config)  # type: ignore[arg-type]
    registered = _register(con, traces, labels)
    # one script, like run_all: each DuckDB call gives up the GIL and waits to take it back
    script = [
        # Analyzers order explicitly where order matters; letting DuckDB drop insertion
        # order parallelises the window over tokens (about 1.6x less wall time).
        "SET preserve_insertion_order = false",
        # stderr is for one-line diagnostics; DuckDB's progress bar would draw there on long queries
        "SET enable_progress_bar = false",
    ]
    for name, spec in TABLES.items():
        cols = ", ".join(f'"{c.name}"' for c in spec.columns)
        if stacked(traces):
            script.append(f"CREATE VIEW {name} AS {_stacked_view(traces, name, cols)}")
            continue
        union = " UNION ALL ".join(f"SELECT {_lit(label)} AS trace, {cols} FROM _t{i}_{name}"
                                   for i, label in enumerate(labels))
        script.append(f"CREATE VIEW {name} AS {union}")
    con.execute(";\n".join(script))
    _param_tables(con, traces, labels, roof, thresholds or Thresholds(), claims)
    lazy = [f for t in traces for tab in t.lazy.values() for f in lazy_files(tab)]
    if lazy:  # the lazy tables' Parquet files stay readable, nothing else
        con.execute("SET allowed_paths = [" + ", ".join(_lit(f) for f in lazy) + "]")
    con.execute("SET enable_external_access = false; SET python_enable_replacements = false")
    run_all(con, _disabled(small), _flags(traces, memory_limit, spill, tail=tail, gaps=gaps))
    return con, registered


#: Above this many traces, each table of every trace is read as one relation with a ``trace`` column
#: (:func:`_register`), not as a view per trace joined by UNION ALL: the plans of a union grow with
#: the number of traces (a fleet of 2,000 small traces ran DuckDB out of memory planning them).
STACK_TRACES = 16


def stacked(traces: Sequence[Trace]) -> bool:
    """Whether ``traces`` are registered as one relation per table (more than :data:`STACK_TRACES`)."""
    return len(traces) > STACK_TRACES


def _register(con: duckdb.DuckDBPyConnection, traces: Sequence[Trace], labels: Sequence[str]) -> set[str]:
    """Register the traces' tables; returns the names.

    A few traces: each trace's tables as ``_t<i>_<table>``. Many (:func:`stacked`): per table, the
    traces' in-memory tables as one Arrow table ``_all_<table>`` (their chunks, not copied, and a
    dictionary-encoded ``trace`` column), and their lazy Parquet files as one multi-file scan
    (:func:`tracetool.lazy.stacked_view_sql`, files mapped to traces by ``_lazy_files``).
    """
    if not stacked(traces):
        return {n for i, t in enumerate(traces) for n in t.register(con, prefix=f"_t{i}_")}
    import numpy as np
    import pyarrow as pa

    names = set()
    dictionary = pa.array(list(labels), pa.string())
    for name, spec in TABLES.items():
        schema = spec.arrow_schema
        which, parts = [], []
        for i, t in enumerate(traces):
            if name in t.lazy or not t.rows(name):
                continue
            table = t.table(name)
            if not table.schema.equals(schema):
                table = table.select(schema.names).cast(schema)
            which.append(i)
            parts.append(table)
        # one concatenation (the parts' buffers, not copied) and one label column for all of them
        whole = pa.concat_tables(parts) if parts else pa.Table.from_batches([], schema)
        index = np.repeat(np.asarray(which, np.int32), [p.num_rows for p in parts])
        trace = pa.DictionaryArray.from_arrays(pa.array(index, pa.int32()), dictionary)
        con.register(f"_all_{name}", whole.append_column("trace", trace))
        names.add(f"_all_{name}")
    lazy: list[list[object]] = [[str(f), label] for t, label in zip(traces, labels, strict=True)
            for tab in t.lazy.values() for f in lazy_files(tab)]
    if lazy:
        _table(con, "_lazy_files", "file VARCHAR, trace VARCHAR", lazy)
    return names


def _stacked_view(traces: Sequence[Trace], name: str, cols: str) -> str:
    """The SELECT of a stacked table's view: its in-memory part, and its lazy part if any trace has one."""
    from tracetool.lazy import stacked_view_sql

    sql = f"SELECT CAST(trace AS VARCHAR) AS trace, {cols} FROM _all_{name}"
    lazy = [t.lazy[name] for t in traces if name in t.lazy]
    if lazy:
        sql += f" UNION ALL SELECT trace, {cols} FROM ({stacked_view_sql(lazy, '_lazy_files')})"
    return sql


def _disabled(small: bool) -> str:
    """The optimizer passes the modules run without (see analyzers.modules)."""
    return SMALL_DISABLED_OPTIMIZERS if small else DISABLED_OPTIMIZERS


@contextmanager
def _optimizers(con: duckdb.DuckDBPyConnection, small: bool) -> Iterator[None]:
    con.execute(f"SET disabled_optimizers = '{_disabled(small)}'")
    try:
        yield
    finally:
        con.execute("RESET disabled_optimizers")


class Session:
    """One connection analysing successive snapshots of the same traces: a live view's.

    A live viewer re-analyses its sources several times a second; from one snapshot to the
    next the traces' tables change, their number and labels do not. Opening a connection and
    creating the union views, the macros, the modules' views and the catalogue again each time
    is about a third of a small analysis. A session keeps them: for each snapshot it registers
    the new Arrow tables under the same names, refills the two per-trace parameter tables and
    runs the modules' temp-table statements again, prepared once (DuckDB binds them again by
    itself when a table's schema changed). Anything else (other labels, another number of
    traces, thresholds or claims, a trace crossing :data:`SINGLE_THREAD_ROWS`) opens a fresh
    connection, and so does any error while reusing one.

    Not for two analyses at once: hold :attr:`lock` while using :meth:`connect`'s result (an
    :class:`~analyzers.analysis.Analysis` made from it shares the lock, so its ``query`` waits
    for the next snapshot's refresh and then sees that snapshot).
    """

    def __init__(self, *, tail: bool = True) -> None:
        #: False: the tail's modules are not run for a snapshot (a live view's ticks): their tables are empty,
        #: the analysis's ``tail`` is null and no tail finding fires (analyzers.modules.TAIL_MODULES)
        self.tail = tail
        self.lock = threading.Lock()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._key: tuple[object, ...] | None = None
        self._refresh_sql = ""
        self._registered: set[str] = set()
        #: fresh connections opened and snapshots refreshed in place (for tests and benchmarks)
        self.opened = 0
        self.reused = 0

    def connect(self, traces: Sequence[Trace], *, roofline: Sequence[RooflineInputs],
                thresholds: Thresholds, claims: Sequence[ClaimSpec],
                labels: Sequence[str]) -> duckdb.DuckDBPyConnection:
        """The session's connection holding ``traces`` and every analyzer object (caller holds
        :attr:`lock`)."""
        small = is_small(traces)
        key = (tuple(labels), small, thresholds, tuple(claims), self.tail)
        if self._con is not None and self._key == key:
            try:
                self._refresh(self._con, traces, labels, roofline, small)
                self.reused += 1
                return self._con
            except duckdb.Error:
                self.close()  # a fresh connection says what is wrong, if anything is
        self.close()
        con, self._registered = _open(traces, roofline=roofline, thresholds=thresholds, claims=claims,
                                      labels=labels, tail=self.tail)
        self._prepare(con, small)
        self._con, self._key = con, key
        self.opened += 1
        return con

    def close(self) -> None:
        if self._con is not None:
            try:
                self._con.close()
            except duckdb.Error:
                pass
        self._con, self._key = None, None

    def _prepare(self, con: duckdb.DuckDBPyConnection, small: bool) -> None:
        steps = []
        skipped = set() if self.tail else tail_tables()
        with _optimizers(con, small):
            for stmt in modules_script().split(";\n"):
                m = TEMP_TABLE_RE.match(stmt.strip())
                if m and m.group(1) in skipped:
                    steps.append(f"DELETE FROM {m.group(1)};\n")  # empty, in its place: later modules read it
                elif m:
                    con.execute(f"PREPARE _refresh_{m.group(1)} AS INSERT INTO {m.group(1)} {m.group(2)}")
                    steps.append(f"DELETE FROM {m.group(1)}; EXECUTE _refresh_{m.group(1)};\n")
        self._refresh_sql = "".join(steps)

    def _refresh(self, con: duckdb.DuckDBPyConnection, traces: Sequence[Trace], labels: Sequence[str],
                 roof: Sequence[RooflineInputs], small: bool) -> None:
        if stacked(traces) and any(t.lazy for t in traces):
            raise duckdb.InvalidInputException("stacked lazy tables: open a fresh connection")
        names = _register(con, traces, labels)
        for gone in self._registered - names:  # a table outside the v1 set that this snapshot lacks
            con.unregister(gone)
        self._registered = names
        con.execute("DELETE FROM _traces; DELETE FROM _hardware")
        _insert(con, "_traces", _traces_rows(traces, labels))
        _insert(con, "_hardware", _hardware_rows(roof, labels))
        with _optimizers(con, small):
            con.execute(self._refresh_sql)  # one script: the GIL given up once (see run_all)


def _traces_rows(traces: Sequence[Trace], labels: Sequence[str]) -> list[list[object]]:
    rows: list[list[object]] = []
    for t, label in zip(traces, labels, strict=True):
        dropped = sum(int(v) for v in (t.meta.get("dropped_rows") or {}).values()
                      if isinstance(v, (int, float)))
        rows.append([label, str(Path(t.path)), t.table_names(), dropped, t.meta.get("closed") is not False])
    return rows


def _hardware_rows(roof: Sequence[RooflineInputs], labels: Sequence[str]) -> list[list[object]]:
    return [[label, *astuple(r)] for r, label in zip(roof, labels, strict=True)]


def _param_tables(con: duckdb.DuckDBPyConnection, traces: Sequence[Trace], labels: Sequence[str],
                  roof: Sequence[RooflineInputs], thresholds: Thresholds,
                  claims: Sequence[ClaimSpec]) -> None:
    _table(con, "_traces", "trace VARCHAR, path VARCHAR, tables VARCHAR[], dropped_rows BIGINT, closed BOOLEAN",
           _traces_rows(traces, labels))
    rf = fields(RooflineInputs)
    _table(con, "_hardware", "trace VARCHAR, " + ", ".join(f"{f.name} {_sql_type(f.type)}" for f in rf),
           _hardware_rows(roof, labels))
    tf = fields(Thresholds)
    _table(con, "_thresholds", ", ".join(f"{f.name} DOUBLE" for f in tf), [list(astuple(thresholds))])
    _table(con, "_claims", "ordinal INTEGER, claim VARCHAR, key VARCHAR, scope_metric VARCHAR, scope_level VARCHAR, "
           "tail_component VARCHAR",
           [[i, c.text, c.key, c.scope_metric, c.scope_level, c.tail_component] for i, c in enumerate(claims)])


def _table(con: duckdb.DuckDBPyConnection, name: str, columns: str, rows: list[list[object]]) -> None:
    """A temp table of ``rows`` (values passed as parameters): one DuckDB call."""
    if len(rows) > PARAMETER_ROWS:
        con.execute(f"CREATE TEMP TABLE {name} ({columns})")
        _insert(con, name, rows)
        return
    sql = f"CREATE TEMP TABLE {name} ({columns})"
    if rows:
        sql += "; " + _insert_sql(name, rows)
    con.execute(sql, [v for row in rows for v in row] or None)


#: Up to this many rows a parameter table is filled by one statement of parameters; past it (a dataset of
#: thousands of traces: 2,000 rows of 30 values took 3.8 s to bind), by one Arrow table, column by column.
PARAMETER_ROWS = 64


def _insert(con: duckdb.DuckDBPyConnection, name: str, rows: list[list[object]]) -> None:
    if len(rows) > PARAMETER_ROWS:
        import pyarrow as pa

        columns = pa.table({f"c{i}": pa.array(list(col)) for i, col in enumerate(zip(*rows, strict=True))})
        con.register("_tracetool_rows", columns)
        try:
            con.execute(f"INSERT INTO {name} SELECT * FROM _tracetool_rows")
        finally:
            con.unregister("_tracetool_rows")
    elif rows:
        con.execute(_insert_sql(name, rows), [v for row in rows for v in row])


def _insert_sql(name: str, rows: list[list[object]]) -> str:
    one = "(" + ", ".join("?" * len(rows[0])) + ")"
    return f"INSERT INTO {name} VALUES " + ", ".join([one] * len(rows))


def _sql_type(t: object) -> str:
    s = str(t)
    if "float" in s:
        return "DOUBLE"
    if "int" in s:
        return "BIGINT"
    if "bool" in s:
        return "BOOLEAN"
    return "VARCHAR"


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"
