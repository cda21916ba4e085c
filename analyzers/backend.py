"""The engine that runs the SQL modules, chosen once per analysis of a dataset.

``analyze_dataset`` analyses the whole, each group and (on DuckDB) each trace alone; which
engine runs them — DuckDB in this process, or Spark SQL (:mod:`analyzers.spark_engine`) —
is decided once, from :attr:`AnalysisOptions.engine`, by :func:`open_backend`. The dataset
code then asks the :class:`Backend` for analyses of sets of opened traces and never looks at
the engine's name again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from analyzers.options import AnalysisOptions

if TYPE_CHECKING:
    from analyzers.analysis import Analysis
    from tracetool.reader import Trace


class Backend(Protocol):
    """Runs every module over a set of opened traces and returns their combined analysis."""

    #: ``duckdb`` or ``spark`` (the document's ``sql_engine``).
    name: str
    #: True when the backend also analyses each trace alone (the document's ``traces`` entries).
    per_trace: bool

    def run(self, traces: Sequence[Trace], labels: Sequence[str], label: str, *,
            memory_limit: int | None = None) -> Analysis:
        """The analysis of ``traces`` together, labelled ``label``.

        Raises:
            BadInput: nothing to analyse, or the engine could not analyse the traces (one line).
        """
        ...


class DuckDBBackend:
    """The modules on DuckDB, in this process (the default)."""

    name = "duckdb"
    per_trace = True

    def __init__(self, options: AnalysisOptions) -> None:
        self.options = options
        self._specs = options.claim_specs()  # an unknown claim fails here, before any trace is analysed

    def run(self, traces: Sequence[Trace], labels: Sequence[str], label: str, *,
            memory_limit: int | None = None) -> Analysis:
        from analyzers.analysis import _run

        roof = [self.options.roofline(t.meta) for t in traces]
        return _run(list(traces), list(labels), roof, self.options.thresholds, self._specs, label, None,
                    memory_limit, self.options.spill)


class SparkBackend:
    """The modules on Spark SQL (``--engine spark``): one Spark session for every analysis."""

    name = "spark"
    per_trace = False

    def __init__(self, options: AnalysisOptions) -> None:
        from analyzers import spark_engine

        self.options = options
        self._specs = options.claim_specs()
        self._spark: Any = spark_engine.session(options.spark_master)

    def run(self, traces: Sequence[Trace], labels: Sequence[str], label: str, *,
            memory_limit: int | None = None) -> Analysis:
        from analyzers import spark_engine

        roof = [self.options.roofline(t.meta) for t in traces]
        return spark_engine.run(self._spark, traces, labels, roof, self.options.thresholds, self._specs, label)


def open_backend(options: AnalysisOptions) -> Backend:
    """The backend ``options.engine`` names.

    Raises:
        UsageError: Spark without pyspark or Java; an unknown claim.
    """
    backends: dict[str, type[DuckDBBackend] | type[SparkBackend]] = {"duckdb": DuckDBBackend, "spark": SparkBackend}
    return backends[options.engine](options)  # AnalysisOptions accepts only the ENGINES


__all__ = ["Backend", "DuckDBBackend", "SparkBackend", "open_backend"]
