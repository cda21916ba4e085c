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
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import astuple, fields
from pathlib import Path

import duckdb

from analyzers.modules import run_all
from analyzers.params import ClaimSpec, RooflineInputs, Thresholds
from tracetool.errors import BadInput
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


def connect(traces: Sequence[Trace], *, roofline: Sequence[RooflineInputs] | None = None,
            thresholds: Thresholds | None = None, claims: Sequence[ClaimSpec] = (),
            labels: Sequence[str] | None = None) -> duckdb.DuckDBPyConnection:
    """Register ``traces`` and run every analyzer module; returns the connection.

    Args:
        traces: opened traces (see :func:`load_traces`).
        roofline: one :class:`RooflineInputs` per trace (default: from each meta.json).
        thresholds: finding and claim thresholds (default: :class:`Thresholds()`).
        claims: claims to give verdicts on (see :func:`analyzers.params.parse_claim`).
        labels: trace labels (default: :func:`labels_for`).

    The connection has external access disabled. The trace tables are registered on
    this connection only (a ``con.cursor()`` does not see them), and a connection is
    not thread-safe: use it from one thread at a time (``Analysis.query`` holds a lock).
    """
    from analyzers.params import roofline_inputs

    labels = list(labels) if labels is not None else labels_for(traces)
    roof = list(roofline) if roofline is not None else [roofline_inputs(t.meta) for t in traces]
    con = duckdb.connect(":memory:")
    # Analyzers order explicitly where order matters; letting DuckDB drop insertion
    # order parallelises the window over tokens (about 1.6x less wall time).
    con.execute("SET preserve_insertion_order = false")
    # stderr is for one-line diagnostics; DuckDB's progress bar would draw there on long queries
    con.execute("SET enable_progress_bar = false")
    for i, t in enumerate(traces):
        t.register(con, prefix=f"_t{i}_")
    for name, spec in TABLES.items():
        cols = ", ".join(f'"{c.name}"' for c in spec.columns)
        union = " UNION ALL ".join(f"SELECT {_lit(label)} AS trace, {cols} FROM _t{i}_{name}"
                                   for i, label in enumerate(labels))
        con.execute(f"CREATE VIEW {name} AS {union}")
    _param_tables(con, traces, labels, roof, thresholds or Thresholds(), claims)
    con.execute("SET enable_external_access = false")
    con.execute("SET python_enable_replacements = false")
    run_all(con)
    return con


def _param_tables(con: duckdb.DuckDBPyConnection, traces: Sequence[Trace], labels: Sequence[str],
                  roof: Sequence[RooflineInputs], thresholds: Thresholds,
                  claims: Sequence[ClaimSpec]) -> None:
    con.execute("CREATE TEMP TABLE _traces (trace VARCHAR, path VARCHAR, tables VARCHAR[], "
                "dropped_rows BIGINT, closed BOOLEAN)")
    for t, label in zip(traces, labels, strict=True):
        dropped = sum(int(v) for v in (t.meta.get("dropped_rows") or {}).values()
                      if isinstance(v, (int, float)))
        con.execute("INSERT INTO _traces VALUES (?, ?, ?, ?, ?)",
                    [label, str(Path(t.path)), sorted(t.tables), dropped, t.meta.get("closed") is not False])
    rf = fields(RooflineInputs)
    con.execute("CREATE TEMP TABLE _hardware (trace VARCHAR, "
                + ", ".join(f"{f.name} {_sql_type(f.type)}" for f in rf) + ")")
    for r, label in zip(roof, labels, strict=True):
        con.execute(f"INSERT INTO _hardware VALUES (?{', ?' * len(rf)})", [label, *astuple(r)])
    tf = fields(Thresholds)
    con.execute("CREATE TEMP TABLE _thresholds AS SELECT "
                + ", ".join(f"?::DOUBLE AS {f.name}" for f in tf), list(astuple(thresholds)))
    con.execute("CREATE TEMP TABLE _claims (ordinal INTEGER, claim VARCHAR, key VARCHAR)")
    for i, c in enumerate(claims):
        con.execute("INSERT INTO _claims VALUES (?, ?, ?)", [i, c.text, c.key])


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
