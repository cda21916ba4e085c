"""tracetool's analyzers: where a trace's latency went, and which story about it is wrong.

The analyses are SQL modules (``analyzers/<module>.sql``) run by DuckDB over the
trace's Arrow tables, registered without copies. Python here only opens traces,
resolves parameters (thresholds, roofline inputs, claims), runs the modules and
returns Arrow tables and dicts. Using this package loads DuckDB and pyarrow (on first
use of a name, not at import), never torch, textual or pynvml.

Public API:

* :func:`analyze` ``(traces, options=None, *, model=None, gpu=None, ...) -> Analysis``: the
  whole analysis, its options one :class:`AnalysisOptions` (or its fields as keywords);
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

import importlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb

    from analyzers.analysis import FORMAT, TABLES, VERSION, Analysis, analyze
    from analyzers.connection import TraceArg, load_traces
    from analyzers.estimate import Estimate, estimate
    from analyzers.modules import MODULES, documented_objects
    from analyzers.options import AnalysisOptions
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

#: Where each public name lives. The package root imports none of them: ``analyzers.options`` (what the
#: CLI builds while it parses options, what the TUI's headless model holds) stays free of DuckDB; the
#: first use of ``analyzers.analyze`` and the others loads their module.
_HOMES = {
    **dict.fromkeys(("FORMAT", "TABLES", "VERSION", "Analysis", "analyze"), "analyzers.analysis"),
    **dict.fromkeys(("TraceArg", "load_traces"), "analyzers.connection"),
    **dict.fromkeys(("Estimate", "estimate"), "analyzers.estimate"),
    **dict.fromkeys(("MODULES", "documented_objects"), "analyzers.modules"),
    "AnalysisOptions": "analyzers.options",
    **dict.fromkeys(("CLAIM_ALIASES", "CLAIMS", "ClaimSpec", "RooflineInputs", "Thresholds", "parse_claim",
                     "parse_threshold", "roofline_inputs"), "analyzers.params"),
    "COMPONENTS": "tracetool.schema",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'analyzers' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def connect(traces: TraceArg | Iterable[TraceArg], *, model: str | None = None, gpu: str | None = None,
            gpus: int | None = None, claims: Sequence[str] = (), thresholds: Thresholds | None = None,
            **kwargs: Any) -> duckdb.DuckDBPyConnection:
    """Open traces (paths or Trace objects) and return a connection with every analyzer object.

    The trace tables are views ``spans``, ``tokens``, ``gpu``, ``stacks``, ``steps`` and
    ``requests`` (with a ``trace`` column); the analyzer objects are listed by
    :func:`documented_objects`. External access (files, network, extensions) is disabled.
    """
    from analyzers.connection import connect as _connect
    from analyzers.connection import load_traces
    from analyzers.options import AnalysisOptions

    opened = load_traces(traces)
    options = AnalysisOptions.of(model=model, gpu=gpu, gpus=gpus, claims=claims, thresholds=thresholds)
    return _connect(opened, roofline=[options.roofline(t.meta) for t in opened], thresholds=options.thresholds,
                    claims=options.claim_specs(), **kwargs)


__all__ = [
    "CLAIMS", "CLAIM_ALIASES", "COMPONENTS", "FORMAT", "MODULES", "TABLES", "VERSION", "Analysis",
    "AnalysisOptions", "ClaimSpec", "Estimate", "RooflineInputs", "Thresholds", "analyze", "connect",
    "documented_objects", "estimate", "load_traces", "parse_claim", "parse_threshold", "roofline_inputs",
]
