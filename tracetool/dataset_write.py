"""``convert --dataset``: a dataset rewritten as partitioned Parquet laid out for scans.

Each trace keeps its place in the tree (the hive ``key=value`` folders are the
partitioning) and stays a valid v1 trace on its own (its ``meta.json`` next to
one Parquet file per table), so everything that reads a trace reads each part,
and a dataset reader (DuckDB, Spark, pyarrow.dataset) reads the tree. Within a
file, rows are sorted by the keys the analyzers partition and order by
(:data:`SORT_KEYS`: a request's tokens are contiguous and in order, and the row
groups' min/max statistics on ``request_id`` let a reader skip what a filter
excludes), compressed with zstd, in row groups of :data:`ROW_GROUP_ROWS` rows: large
enough that a scan reads long runs of one column, small enough that a reader holds
one group per thread in bounded memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from tracetool.dataset import Member, discover, open_members
from tracetool.errors import BadInput, UsageError
from tracetool.meta import write_meta
from tracetool.schema import EXTENSIONS
from tracetool.writer.output import check_output

#: Rows per Parquet row group (about 10-40 MB per tokens group uncompressed).
ROW_GROUP_ROWS = 1 << 20
#: zstd level: 3 is zstd's default, about gzip's ratio at several times its speed.
ZSTD_LEVEL = 3
#: Sort order of each known table (columns missing from a table are left out).
SORT_KEYS: dict[str, tuple[str, ...]] = {
    "tokens": ("request_id", "index"),
    "spans": ("request_id", "start_ns"),
    "requests": ("request_id",),
    "steps": ("start_ns",),
    "gpu": ("gpu", "ts_ns"),
    "stacks": ("ts_ns",),
}


@dataclass
class Converted:
    """What :func:`write_dataset` wrote and what it could not read."""

    written: list[Path]
    rows: int
    bad: list[tuple[Member, str]]


def write_dataset(paths: Sequence[Path], output: Path, *, force: bool = False) -> Converted:
    """Rewrite the traces under ``paths`` into ``output``, keeping their relative folders.

    Raises:
        UsageError: ``output`` is not empty (without ``force``) or lies inside an input.
        BadInput: nothing readable, mixed versions, or ``output`` cannot be written.
    """
    ds = discover(paths)
    check_output(output, force)
    out_res = output.resolve()
    for m in ds.members:
        if out_res == m.path.resolve() or m.path.resolve() in out_res.parents:
            raise UsageError("output must be a different directory from the input, outside every trace")
    opened = open_members(ds, forgiving=True)
    written: list[Path] = []
    rows = 0
    try:
        for m, t in opened.traces:
            dest = output / m.label if ds.is_tree else output / (m.path.name or "trace")
            dest.mkdir(parents=True, exist_ok=True)
            for p in dest.iterdir():
                if p.suffix[1:] in EXTENSIONS:
                    p.unlink()
            for name, table in t.tables.items():
                write_table(sort_table(name, table), dest / f"{name}.parquet")
                rows += table.num_rows
            meta = dict(t.meta)
            meta["notes"] = [*list(meta.get("notes") or []), f"converted to a Parquet dataset from {t.path}"]
            meta.setdefault("closed", True)
            write_meta(dest, meta)
            written.append(dest)
    except OSError as e:
        raise BadInput(f"{output}: cannot write ({e.strerror or e})") from e
    return Converted(written, rows, opened.bad)


def sort_table(name: str, table: pa.Table) -> pa.Table:
    """``table`` sorted by its :data:`SORT_KEYS` (unknown tables as they are)."""
    keys = [k for k in SORT_KEYS.get(name, ()) if k in table.schema.names]
    if not keys or table.num_rows < 2:
        return table
    return table.sort_by([(k, "ascending") for k in keys])


def write_table(table: pa.Table, path: Path) -> None:
    """One Parquet file: zstd, :data:`ROW_GROUP_ROWS`-row groups, statistics on."""
    import pyarrow.parquet as pq

    pq.write_table(table, path, compression="zstd", compression_level=ZSTD_LEVEL, row_group_size=ROW_GROUP_ROWS,
                   write_statistics=True)


__all__ = ["ROW_GROUP_ROWS", "SORT_KEYS", "Converted", "sort_table", "write_dataset", "write_table"]
