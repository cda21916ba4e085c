"""``--engine spark``: the analyzer modules run by Apache Spark SQL, locally or on a cluster.

The same documented modules as DuckDB's, translated statement by statement
(:mod:`analyzers.spark_sql`), over the same union views and parameter tables
(:mod:`analyzers.connection`): Parquet tables are read by Spark itself, lazily and
in parallel (on a cluster, from any path its executors reach, object storage
included); tables held in memory (Arrow streams) are handed over as Arrow. The
summary tables come back as Arrow into an :class:`~analyzers.analysis.Analysis`,
so the JSON is built by the same code as DuckDB's.

Needs the ``spark`` extra (``pip install 'tracetool-llm[spark]'``) and Java 17.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from collections.abc import Sequence
from dataclasses import astuple, fields
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from analyzers.analysis import TABLES, Analysis, input_warnings, named
from analyzers.connection import _hardware_rows, _traces_rows
from analyzers.modules import all_modules
from analyzers.params import ClaimSpec, RooflineInputs, Thresholds
from tracetool.errors import BadInput, UsageError, one_line
from tracetool.reader import Trace
from tracetool.schema import TABLES as TRACE_TABLES

#: Spark settings the translated modules rely on (see analyzers.spark_sql).
SESSION_CONF = {
    # DuckDB semantics: x / 0 and bad casts give NULL, not an error
    "spark.sql.ansi.enabled": "false",
    # `(?!(a|b)$).+` columns stand for DuckDB's * EXCLUDE (a, b)
    "spark.sql.parser.quotedRegexColumnNames": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.enabled": "false",
    # no progress bars on stderr, where tracetool's own one-line messages go
    "spark.ui.showConsoleProgress": "false",
    # the summary and findings statements are one-row projections of hundreds of expressions;
    # inferring constraints over them takes the optimizer minutes and gigabytes, and gains nothing
    "spark.sql.constraintPropagation.enabled": "false",
}
#: The local driver's log (spark_log4j2.properties): errors only, one line each, none from the code
#: generator (whose failures Spark recovers from); a cluster's log is the cluster's.
LOG_CONFIG = Path(__file__).with_name("spark_log4j2.properties")
#: Local mode only: the driver listens on loopback, few shuffle partitions for small data, its log.
LOCAL_CONF = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
              "spark.sql.shuffle.partitions": "8", "spark.driver.memory": "2g",
              "spark.driver.extraJavaOptions": f'-Dlog4j2.configurationFile="{LOG_CONFIG}"'}


def java_missing() -> str | None:
    """Why Spark cannot start here (no Java, no pyspark), or None."""
    try:
        import pyspark  # noqa: F401
        import sqlglot  # noqa: F401
    except ImportError as e:
        return f"{e.name} is not installed (pip install 'tracetool-llm[spark]')"
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        return "Java is not installed (Spark needs Java 17 or later; set JAVA_HOME)"
    return None


def session(master: str | None = None) -> Any:
    """A Spark session (``local[*]`` unless ``master`` names a cluster, or the master spark-submit
    gave when run under it) configured for the modules.

    Raises:
        UsageError: pyspark or Java is missing.
    """
    why = java_missing()
    if why:
        raise UsageError(f"--engine spark: {why}")
    from pyspark.sql import SparkSession

    b = SparkSession.builder.appName("tracetool analyze")
    # under spark-submit the master (and the cluster's settings) come from spark-submit
    submitted = master is None and "PYSPARK_GATEWAY_PORT" in os.environ
    if not submitted:
        b = b.master(master or "local[*]")
    local = not submitted and (not master or master.startswith("local"))
    for k, v in {**SESSION_CONF, **(LOCAL_CONF if local else {})}.items():
        b = b.config(k, v)
    with warnings.catch_warnings():  # pyspark warns that it was not tested with this pandas: not the user's to fix
        warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas", FutureWarning)
        spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


_CACHE_RE = re.compile(r"CACHE TABLE (\w+) AS (.*)", re.S)
_SPARK_TYPES = {"int64": "BIGINT", "int32": "INT", "double": "DOUBLE", "string": "STRING", "bool": "BOOLEAN",
                "float": "FLOAT", "int16": "SMALLINT", "int8": "TINYINT", "large_string": "STRING"}


def _ddl(schema: pa.Schema) -> str:
    return ", ".join(f"`{f.name}` {_SPARK_TYPES.get(str(f.type), 'STRING')}" for f in schema)


def _frame(spark: Any, trace: Trace, name: str) -> Any:
    spec = TRACE_TABLES[name]
    if name in trace.lazy:
        files = [str(p) for p in trace.files[name]]
        return spark.read.schema(_ddl(spec.arrow_schema)).parquet(*files)
    table = trace.table(name).select([c.name for c in spec.columns])
    if table.num_rows == 0:
        return spark.createDataFrame([], _ddl(spec.arrow_schema))
    return spark.createDataFrame(table)


def _params(spark: Any, name: str, ddl: str, rows: list[list[object]]) -> None:
    spark.createDataFrame([tuple(r) for r in rows], ddl).createOrReplaceTempView(name)


def run(spark: Any, traces: Sequence[Trace], labels: Sequence[str], roof: Sequence[RooflineInputs],
        thresholds: Thresholds, claims: Sequence[ClaimSpec], label: str) -> Analysis:
    """Run every module on Spark over ``traces``; the summary tables come back in an Analysis.

    Raises:
        BadInput: Spark could not analyse the traces (the first line of its error), or no request.
    """
    s = spark.newSession()  # its own temporary views and cached tables
    step = "registering the traces"
    try:
        for i, t in enumerate(traces):
            for name in TRACE_TABLES:
                _frame(s, t, name).createOrReplaceTempView(f"_t{i}_{name}")
        for name, spec in TRACE_TABLES.items():
            cols = ", ".join(f"`{c.name}`" for c in spec.columns)
            union = " UNION ALL ".join(f"SELECT {_lit(lab)} AS trace, {cols} FROM _t{i}_{name}"
                                       for i, lab in enumerate(labels))
            s.sql(f"CREATE OR REPLACE TEMPORARY VIEW {name} AS {union}")
        _params(s, "_traces", "trace STRING, path STRING, tables ARRAY<STRING>, dropped_rows BIGINT, closed BOOLEAN",
                _traces_rows(traces, labels))
        _params(s, "_hardware", "trace STRING, " + ", ".join(f"{f.name} {_spark_type(f.type)}"
                                                               for f in fields(RooflineInputs)),
                _hardware_rows(roof, labels))
        _params(s, "_thresholds", ", ".join(f"{f.name} DOUBLE" for f in fields(Thresholds)),
                [[float(v) for v in astuple(thresholds)]])
        _params(s, "_claims", "ordinal INT, claim STRING, key STRING, scope_metric STRING, scope_level STRING, "
                "tail_component STRING",
                [[i, c.text, c.key, c.scope_metric, c.scope_level, c.tail_component] for i, c in enumerate(claims)])
        from analyzers.spark_sql import translate_script

        for stmt in translate_script([st for m in all_modules() for st in m.statements]):
            step = stmt[:60]
            m = _CACHE_RE.match(stmt)
            if m:
                # a summary table: computed now and its lineage cut, so the statements after it plan
                # over its rows, not over the plans of every module before it (which grow past what
                # the analyzer can hold)
                s.sql(m.group(2)).localCheckpoint(eager=True).createOrReplaceTempView(m.group(1))
            else:
                s.sql(stmt)
        step = "collecting the summary tables"
        tables = {name: s.table(name).toArrow() for name in TABLES}
    except Exception as e:  # pyspark's errors (Py4J, AnalysisException) share no base class
        if isinstance(e, (BadInput, UsageError)):
            raise
        first = one_line(e)
        raise BadInput(f"{named(t.path for t in traces)}: Spark cannot analyse ({first}; at {step!r})") from e
    if tables["attribution_requests"].num_rows == 0:
        raise BadInput(f"{named(t.path for t in traces)}: no requests to analyse")
    con = duckdb.connect(":memory:")  # holds the summary tables for Analysis.query
    for name, table in tables.items():
        con.register(name, table)
    return Analysis(label=label, paths=[str(t.path) for t in traces], tables=tables, roofline_inputs=list(roof),
                    thresholds=thresholds, con=con, warnings=input_warnings(traces, roof))


def _spark_type(t: object) -> str:
    s = str(t)
    if "float" in s:
        return "DOUBLE"
    if "int" in s:
        return "BIGINT"
    if "bool" in s:
        return "BOOLEAN"
    return "STRING"


def _lit(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


__all__ = ["SESSION_CONF", "java_missing", "run", "session"]
