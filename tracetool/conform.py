"""The format's types and row rules, applied to a table read from anywhere (a file, a stream, a
Parquet footer): :func:`conform_table` casts to the canonical types, :func:`broken_rows` and
:func:`check_rows` find the rows that break the rules. The reader and the lazy Parquet scan both
use them; neither knows the other."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracetool.errors import TraceFormatError, one_line
from tracetool.schema import CLOCKS, METRICS_CLOCKS, Table


def conform_table(table: pa.Table, spec: Table, where: str) -> pa.Table:
    """Cast a table's known columns to the canonical types, add absent optional ones as nulls."""
    names = table.schema.names
    for dup in {n for n in names if names.count(n) > 1}:
        raise TraceFormatError("column appears twice", path=where, table=spec.name, column=dup)
    columns: dict[str, pa.ChunkedArray] = {}
    for col in spec.columns:
        if col.name not in names:
            if col.required:
                raise TraceFormatError("required column missing", path=where, table=spec.name, column=col.name)
            columns[col.name] = pa.chunked_array([pa.nulls(table.num_rows, col.type)])
            continue
        columns[col.name] = _cast(table.column(col.name), col.type, col.kind, col.name, spec.name, where)
    for extra in names:  # extra columns are kept, after the known ones
        if extra not in columns:
            columns[extra] = table.column(extra)
    fields = [pa.field(c.name, c.type, nullable=not c.required) for c in spec.columns]
    fields += [table.schema.field(n) for n in names if spec.column(n) is None]
    return pa.Table.from_arrays(list(columns.values()), schema=pa.schema(fields))


def _cast(arr: pa.ChunkedArray, target: pa.DataType, kind: str, column: str, table: str,
          where: str) -> pa.ChunkedArray:
    t = arr.type
    if t == target:
        return arr
    ok = False
    if kind == "int":
        ok = pa.types.is_integer(t) or (column.endswith("_ns") and (
            (pa.types.is_timestamp(t) or pa.types.is_duration(t)) and t.unit == "ns"))
        if ok and not pa.types.is_integer(t):
            arr = arr.cast(pa.int64())
    elif kind == "float":
        ok = pa.types.is_integer(t) or pa.types.is_floating(t)
    else:
        ok = _is_string_like(t)
        if pa.types.is_dictionary(t):
            arr = arr.cast(t.value_type)
    if not ok or pa.types.is_null(t):
        raise TraceFormatError(f"type {t} not accepted (expected {_expected(kind, target)})",
                               path=where, table=table, column=column)
    try:
        return arr.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise TraceFormatError(f"values do not fit {target} ({one_line(e)})", path=where, table=table,
                               column=column) from e


def _is_string_like(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return _is_string_like(t.value_type)
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t)
                or getattr(pa.types, "is_string_view", lambda _t: False)(t))


def _expected(kind: str, target: pa.DataType) -> str:
    return {"int": f"{target}, any integer width", "float": "a float or integer",
            "string": "string, large_string or dictionary-encoded string"}[kind]


def broken_rows(data: pa.Table | pa.RecordBatch, spec: Table) -> Iterator[tuple[str, Any, str]]:
    """The format's row rules a table breaks: ``(column, mask of the breaking rows, rule)`` each.

    The rules: no nulls in required columns, intervals in order (a null bound is no interval),
    known clocks, no negative token index. Nothing is computed past a cheap check when a rule
    holds (null counts, one comparison, the distinct clocks, the lowest index).
    """
    if not data.num_rows:
        return
    for col in spec.required:
        if data.column(col.name).null_count:
            yield col.name, pc.is_null(data.column(col.name)), "null value(s) in a required column"
    for start, end in spec.intervals:
        # no Python scalar unless a rule is broken: converting one makes pyarrow import pandas
        bad = pc.less(data.column(end), data.column(start))
        if pc.any(bad).as_py():  # nulls skipped: a null bound is no interval
            yield end, pc.fill_null(bad, False), f"row(s) with {end} < {start}"
    clocks = _clocks(spec.name)
    if clocks and "clock" in data.schema.names:
        # Distinct values compared in Python: building an Arrow array from Python values
        # (pa.array(CLOCKS)) would import pandas on every read.
        clock = data.column("clock")
        if any(c not in clocks for c in pc.unique(clock).to_pylist() if c is not None):
            known: Any = pc.equal(clock, clocks[0])
            for c in clocks[1:]:
                known = pc.or_(known, pc.equal(clock, c))
            yield "clock", pc.invert(pc.fill_null(known, True)), "unknown clock"
    if spec.name == "tokens":
        index = data.column("index")
        lowest = pc.min(index).as_py()  # no Python scalar (and no pandas) unless one is negative
        if lowest is not None and lowest < 0:
            yield "index", pc.fill_null(pc.less(index, 0), False), "row(s) with a negative index"


def _clocks(table: str) -> tuple[str, ...]:
    """The values a table's ``clock`` column may hold (empty: the table has no clock rule)."""
    return CLOCKS if table == "spans" else METRICS_CLOCKS if table == "server_metrics" else ()


def check_rows(table: pa.Table, spec: Table, where: str) -> None:
    """Raise :class:`TraceFormatError` at the first row rule the table breaks (:func:`broken_rows`)."""
    for column, bad, rule in broken_rows(table, spec):
        if column == "clock":
            clocks = _clocks(spec.name)
            unknown = next(c for c in pc.unique(table.column("clock")).to_pylist()
                           if c is not None and c not in clocks)
            message = f"unknown clock {unknown!r} (expected one of {', '.join(clocks)})"
        else:
            message = f"{pc.sum(pc.cast(bad, pa.int64())).as_py()} {rule}"
        raise TraceFormatError(message, path=where, table=spec.name, column=column)


__all__ = ["broken_rows", "check_rows", "conform_table"]
