"""Parquet tables read lazily: a trace's Parquet files as a ``pyarrow.dataset`` that a
reader (DuckDB) scans column by column and row group by row group, never whole in memory.

A lazy table is checked from the files' footers, not their rows: the schema (each known
column in its canonical type, required columns present) and, from each row group's
statistics, that no required column holds a null. Files whose columns need a cast
(another integer width, dictionary strings), or that carry no null counts, are read
eagerly instead (:func:`lazy_parquet` returns None), where every row rule is checked.
``tracetool validate`` checks the rest of the row rules (intervals in order, known
clocks); ``convert --dataset`` writes files that were checked when they were read.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracetool.errors import TraceFormatError, one_line
from tracetool.schema import TABLES


def lazy_parquet(name: str, paths: Sequence[Path]) -> Any | None:
    """A ``pyarrow.dataset.Dataset`` over ``paths`` in the canonical schema, or None when the
    files need the eager reader (not all Parquet, casts needed, no null counts, unknown table).

    Raises:
        TraceFormatError: a file is not readable Parquet, lacks a required column, or holds a
            null in one (named: file, table, column).
    """
    spec = TABLES.get(name)
    if spec is None or not paths or any(p.suffix != ".parquet" for p in paths):
        return None
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from tracetool.conform import conform_table

    target: pa.Schema | None = None
    for path in paths:
        try:
            md = pq.read_metadata(path)
            schema = md.schema.to_arrow_schema()
        except (pa.ArrowException, OSError) as e:
            raise TraceFormatError(f"not a readable Parquet ({one_line(e, 200)})",
                                   path=str(path)) from e
        # the eager reader's type and presence rules, applied to no rows
        conformed = conform_table(schema.empty_table(), spec, str(path)).schema
        for col in spec.columns:
            i = schema.get_field_index(col.name)
            if i >= 0 and schema.field(i).type != col.type:
                return None  # needs a cast: the eager reader does it
        if not _no_required_nulls(md, spec, path):
            return None
        if target is None:
            target = conformed
        elif not target.equals(conformed):
            return None  # segments that disagree: the eager reader reconciles or names them
    assert target is not None
    return ds.dataset([str(p) for p in paths], format="parquet", schema=target)


def _no_required_nulls(md: Any, spec: Any, path: Path) -> bool:
    """False when some row group has no null count for a required column (unknown)."""
    names = [md.schema.column(i).path for i in range(md.num_columns)]
    for rg in range(md.num_row_groups):
        group = md.row_group(rg)
        for col in spec.required:
            if col.name not in names:
                continue
            stats = group.column(names.index(col.name)).statistics
            if stats is None or not stats.has_null_count:
                return False
            if stats.null_count:
                raise TraceFormatError(f"{stats.null_count} null value(s) in a required column", path=str(path),
                                       table=spec.name, column=col.name)
    return True


#: DuckDB's name for each type the trace format uses (tracetool.schema).
_DUCK_TYPES = {pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.float64(): "DOUBLE", pa.string(): "VARCHAR"}


def view_sql(dataset: Any) -> str:
    """A SELECT that reads a lazy table's files with DuckDB's own Parquet reader, in the canonical
    schema: columns no file has are typed NULLs. DuckDB's reader keeps every buffer it scans with
    within the connection's memory limit, where a ``pyarrow.dataset`` scan's read-ahead is outside it.
    """
    present = {n for frag in dataset.get_fragments() for n in frag.physical_schema.names}
    cols = []
    for f in dataset.schema:
        q = '"' + f.name.replace('"', '""') + '"'
        cols.append(q if f.name in present else f"CAST(NULL AS {_DUCK_TYPES.get(f.type, 'VARCHAR')}) AS {q}")
    files = ", ".join("'" + p.replace("'", "''") + "'" for p in dataset.files)
    return f"SELECT {', '.join(cols)} FROM read_parquet([{files}], union_by_name = true)"


def stacked_view_sql(datasets: Sequence[Any], files_table: str) -> str:
    """A SELECT that reads the files of many lazy tables (one per trace) in one multi-file scan, in
    the canonical schema, with a ``trace`` column taken from ``files_table`` (``file``, ``trace``):
    one scan however many traces there are, where a view per trace grows the plans with their
    number. Columns no file has are typed NULLs; a file lacking a column gives NULLs there."""
    present = {n for d in datasets for frag in d.get_fragments() for n in frag.physical_schema.names}
    cols = []
    for f in datasets[0].schema:
        q = '"' + f.name.replace('"', '""') + '"'
        cols.append(f"p.{q}" if f.name in present else f"CAST(NULL AS {_DUCK_TYPES.get(f.type, 'VARCHAR')}) AS {q}")
    paths = ", ".join("'" + p.replace("'", "''") + "'" for d in datasets for p in d.files)
    return (f"SELECT m.trace, {', '.join(cols)} FROM read_parquet([{paths}], union_by_name = true, "
            f"filename = '_tracetool_file') p JOIN {files_table} m ON p._tracetool_file = m.file")


def files(dataset: Any) -> list[str]:
    """The files a lazy table reads."""
    return list(dataset.files)


def rows(dataset: Any) -> int:
    """Rows of a lazy table, from the footers."""
    return int(dataset.count_rows())


__all__ = ["lazy_parquet", "rows", "stacked_view_sql", "view_sql"]
