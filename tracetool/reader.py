"""Reading v1 traces: every table as one Arrow table in its canonical types.

Readers are forgiving where the format allows and exact where it does not:

* integer columns take any integer width, string columns take large and
  dictionary-encoded strings, float columns take ints and floats; ``_ns``
  columns also take ``timestamp[ns]``/``duration[ns]``;
* anything else, a missing required column, a null in one, ``end < start`` or
  an unknown clock is a :class:`TraceFormatError` naming file, table and column;
* extra columns and tables are kept;
* a stream file whose tail was cut keeps every complete batch. When
  ``meta.json`` says the recording was not closed (a recorder killed
  mid-write), the torn tail is expected and only warned about. Otherwise
  ``strict=True`` (``tracetool validate``) reports the cut as an error, and
  other readers keep the prefix and add a warning.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracetool.conform import check_rows, conform_table
from tracetool.errors import BadInput, TraceFormatError, one_line
from tracetool.meta import read_meta
from tracetool.schema import META_FILE, TABLE_FILE_RE, TABLES

_ARROW_FILE_MAGIC = b"ARROW1"
_PARQUET_MAGIC = b"PAR1"


@dataclass
class Trace:
    """A trace read into memory: ``meta.json`` and every table as Arrow."""

    path: Path
    meta: dict[str, Any]
    tables: dict[str, pa.Table]
    files: dict[str, list[Path]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: Tables left on disk (Parquet read lazily, :mod:`tracetool.lazy`): ``pyarrow.dataset`` objects.
    lazy: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.name

    def has(self, name: str) -> bool:
        return name in self.tables or name in self.lazy

    def table_names(self) -> list[str]:
        """The recorded tables, in memory or lazy."""
        return sorted(set(self.tables) | set(self.lazy))

    def table(self, name: str) -> pa.Table:
        """The table, or an empty one in the canonical schema when it was not recorded.

        A lazy table is read into memory here (each call): register the trace instead to scan it."""
        t = self.tables.get(name)
        if t is not None:
            return t
        if name in self.lazy:
            return self.lazy[name].to_table()
        if name in TABLES:
            # from_batches, not Schema.empty_table(): the latter imports pandas (~0.4 s) through
            # pyarrow's Python-object conversion, on every command's start-up path.
            return pa.Table.from_batches([], schema=TABLES[name].arrow_schema)
        raise KeyError(name)

    def rows(self, name: str) -> int:
        t = self.tables.get(name)
        if t is None and name in self.lazy:
            from tracetool.lazy import rows

            return rows(self.lazy[name])
        return 0 if t is None else t.num_rows

    def register(self, con: Any, prefix: str = "") -> list[str]:
        """Register every table (recorded or not, known ones always) in a DuckDB connection.

        Registration scans the Arrow memory in place; nothing is copied. A lazy table is
        registered as its dataset: DuckDB reads the columns and row groups a query needs.
        Returns the registered names.
        """
        names = []
        for name in sorted(set(TABLES) | set(self.tables) | set(self.lazy)):
            if name in self.lazy:
                from tracetool.lazy import view_sql

                con.execute(f"CREATE OR REPLACE TEMP VIEW {prefix}{name} AS {view_sql(self.lazy[name])}")
            else:
                con.register(f"{prefix}{name}", self.table(name))
            names.append(f"{prefix}{name}")
        return names


def open_trace(path: str | os.PathLike[str], *, strict: bool = False,
               tables: Iterable[str] | None = None, lazy: bool = False) -> Trace:
    """Read a trace directory.

    Args:
        path: the trace directory (or its ``meta.json``).
        strict: treat a cut stream tail as an error instead of a warning.
        tables: read only these tables (others are listed in ``files`` but not loaded).
        lazy: leave Parquet tables on disk where their footers show them canonical
            (:mod:`tracetool.lazy`): analyses then scan them in bounded memory.

    Raises:
        BadInput: the path is not a readable trace.
        TraceFormatError: the trace breaks the contract (names file, table, column).
    """
    p = Path(path)
    if p.name == META_FILE and p.is_file():
        p = p.parent
    if not p.exists():
        raise BadInput(f"{p}: no such file or directory")
    if not p.is_dir():
        raise BadInput(f"{p}: not a trace (a trace is a directory holding {META_FILE} and table files)")
    meta = read_meta(p)
    files = table_files(p)
    trace = Trace(path=p, meta=meta, tables={}, files=files)
    wanted = set(tables) if tables is not None else None
    # A recorder that was killed (meta says closed: false) may leave a torn last
    # batch: that is expected, not corruption, even for validate.
    strict_tail = strict and meta.get("closed") is not False
    for name, paths in files.items():
        if wanted is not None and name not in wanted:
            continue
        if lazy:
            from tracetool.lazy import lazy_parquet

            found = lazy_parquet(name, paths)
            if found is not None:
                trace.lazy[name] = found
                continue
        trace.tables[name] = _read_table(name, paths, strict_tail, trace.warnings)
    if meta.get("closed") is False:
        trace.warnings.append(f"{p}: recording was not closed (the recorder was killed or is still running)")
    return trace


def find_traces(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Expand arguments into trace directories: a trace, or a directory tree of traces (a dataset,
    :mod:`tracetool.dataset`)."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir() and not (p / META_FILE).exists():
            subs = walk_traces(p)
            if not subs:
                raise BadInput(f"{p}: neither a trace nor a directory of traces (no {META_FILE} found at any depth)")
            out.extend(subs)
        else:
            out.append(p)
    return out


def walk_traces(root: Path) -> list[Path]:
    """Trace directories at any depth under ``root``, sorted; a trace's own subfolders, and folders
    starting with ``.`` or ``_`` (Spark's and Hive's bookkeeping), are not searched."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        if META_FILE in filenames and Path(dirpath) != root:
            out.append(Path(dirpath))
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
    return sorted(out)


def table_files(directory: Path) -> dict[str, list[Path]]:
    """Table name -> its files, the unsuffixed file first, then segments in natural order."""
    groups: dict[str, list[tuple[tuple[Any, ...], Path]]] = {}
    for entry in directory.iterdir():
        m = TABLE_FILE_RE.match(entry.name)
        if not m or not entry.is_file():
            continue
        suffix = m.group("suffix")
        key = (0, ()) if suffix is None else (1, _natural(suffix))
        groups.setdefault(m.group("table"), []).append((key, entry))
    return {name: [p for _, p in sorted(items, key=lambda kp: (kp[0], kp[1].name))]
            for name, items in sorted(groups.items())}


def _natural(s: str) -> tuple[Any, ...]:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s))


# -- reading files ------------------------------------------------------------------------

def _read_table(name: str, paths: list[Path], strict: bool, warnings: list[str]) -> pa.Table:
    spec = TABLES.get(name)
    parts = []
    for path in paths:
        raw = _read_file(path, strict, warnings)
        if raw is None:
            continue
        parts.append(conform_table(raw, spec, str(path)) if spec else raw)
    if not parts:
        return spec.arrow_schema.empty_table() if spec else pa.table({})
    table = parts[0] if len(parts) == 1 else _concat(parts, name, paths)
    if spec is not None:
        check_rows(table, spec, ", ".join(str(p) for p in paths))
    return table


def _concat(parts: list[pa.Table], name: str, paths: list[Path]) -> pa.Table:
    try:
        return pa.concat_tables(parts, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise TraceFormatError(f"segments do not agree on column types ({one_line(e)})",
                               path=str(paths[0].parent), table=name) from e


def _read_file(path: Path, strict: bool, warnings: list[str]) -> pa.Table | None:
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise BadInput(f"{path}: cannot read ({e.strerror or e})") from e
    if not head:
        if strict:
            raise TraceFormatError("empty file (no Arrow schema)", path=str(path))
        warnings.append(f"{path}: empty file skipped")
        return None
    try:
        if head.startswith(_PARQUET_MAGIC):
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        elif head.startswith(_ARROW_FILE_MAGIC):
            with pa.memory_map(str(path)) as src:
                table = pa.ipc.open_file(src).read_all()
        else:
            table = _read_stream(path, strict, warnings)
        # The readers check a file's structure, not its contents: a corrupt offset or invalid
        # UTF-8 would otherwise fail (or read out of bounds) later, far from the file; the full
        # check is a small part of reading.
        table.validate(full=True)
        return table
    except TraceFormatError:
        raise
    except (pa.ArrowException, OSError, ValueError) as e:
        kind = {"parquet": "Parquet", "arrow": "Arrow IPC file", "arrows": "Arrow IPC stream"}[path.suffix[1:]]
        raise TraceFormatError(f"not a readable {kind} ({one_line(e)})", path=str(path)) from e


def _read_stream(path: Path, strict: bool, warnings: list[str]) -> pa.Table:
    """Read a stream, keeping every complete batch before a cut tail."""
    with pa.memory_map(str(path)) as src:
        try:
            reader = pa.ipc.open_stream(src)
        except (pa.ArrowException, OSError) as e:
            raise TraceFormatError(f"not an Arrow IPC stream: no readable schema ({one_line(e)})",
                                   path=str(path)) from e
        batches = []
        while True:
            try:
                batches.append(reader.read_next_batch())
            except StopIteration:
                break
            except (pa.ArrowException, OSError) as e:
                rows = sum(b.num_rows for b in batches)
                msg = (f"stream cut after {len(batches)} complete batches ({rows} rows); "
                       f"the rest is unreadable ({one_line(e)})")
                if strict:
                    raise TraceFormatError(msg + "; other commands read the complete batches",
                                           path=str(path)) from e
                warnings.append(f"{path}: {msg}")
                break
        return pa.Table.from_batches(batches, schema=reader.schema)
