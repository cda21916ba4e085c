"""tracetool's analyzers: where a trace's latency went, and which story about it is wrong.

The analyses are SQL modules (``analyzers/<module>.sql``) run by DuckDB over the
trace's Arrow tables, registered without copies. Python here only opens traces,
resolves parameters (thresholds, roofline inputs, claims), runs the modules and
returns Arrow tables and dicts. Importing this package loads DuckDB and pyarrow,
never torch, textual or pynvml.

Public API:

* :func:`analyze` ``(traces, *, model=None, gpu=None, gpus=None, weight_dtype=None,
  kv_dtype=None, claims=(), thresholds=None) -> Analysis``: the whole analysis;
  ``Analysis.to_json()`` is the ``tracetool analyze --json`` contract
  (docs/analysis-json.md), ``Analysis.table(name)`` the analyzers' tables.
* :func:`connect` ``(traces, ...) -> duckdb.DuckDBPyConnection``: a connection with
  the trace tables (``spans``, ``tokens``, ... with a ``trace`` column) and every
  analyzer view and table registered by name, external access disabled (the
  TUI's SQL console).
* :func:`estimate` ``(model, gpu, ...) -> Estimate``: napkin math without a trace.
* :class:`Thresholds`, :func:`parse_claim`, :data:`CLAIMS`, :func:`roofline_inputs`.
* :func:`documented_objects`: every public SQL object with its documented columns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import duckdb

from analyzers.analysis import FORMAT, TABLES, VERSION, Analysis, analyze
from analyzers.connection import TraceArg, load_traces
from analyzers.connection import connect as _connect
from analyzers.estimate import Estimate, estimate
from analyzers.modules import MODULES, documented_objects
from analyzers.params import (
    CLAIM_ALIASES,
    CLAIMS,
    ClaimSpec,
    RooflineInputs,
    Thresholds,
    parse_claim,
    parse_threshold,
    roofline_inputs,
)
from tracetool.schema import COMPONENTS


def connect(traces: TraceArg | Iterable[TraceArg], *, model: str | None = None, gpu: str | None = None,
            gpus: int | None = None, claims: Sequence[str] = (), thresholds: Thresholds | None = None,
            **kwargs: Any) -> duckdb.DuckDBPyConnection:
    """Open traces (paths or Trace objects) and return a connection with every analyzer object.

    The trace tables are views ``spans``, ``tokens``, ``gpu``, ``stacks``, ``steps`` and
    ``requests`` (with a ``trace`` column); the analyzer objects are listed by
    :func:`documented_objects`. External access (files, network, extensions) is disabled.
    """
    opened = load_traces(traces)
    roof = [roofline_inputs(t.meta, model=model, gpu=gpu, gpus=gpus) for t in opened]
    return _connect(opened, roofline=roof, thresholds=thresholds,
                    claims=[parse_claim(c) for c in claims], **kwargs)


__all__ = [
    "CLAIMS", "CLAIM_ALIASES", "COMPONENTS", "FORMAT", "MODULES", "TABLES", "VERSION", "Analysis",
    "ClaimSpec", "Estimate", "RooflineInputs", "Thresholds", "analyze", "connect", "documented_objects",
    "estimate", "load_traces", "parse_claim", "parse_threshold", "roofline_inputs",
]
