"""One DuckDB scan of the columns ``tracetool analyze`` reads: the floor a whole-process analysis is held to.

A separate process, like the analysis it is compared with: it starts Python, imports DuckDB and
pyarrow, memory-maps the trace's Arrow files as tracetool's reader does, and runs one query that
reads every value of every column of the tables the analysis reads (``tokens``, ``spans``,
``steps``, ``requests``, ``gpu`` where the trace has them): a ``min`` per column, one aggregate
per table, all in one statement. Nothing is sorted, joined or grouped.

    python benchmarks/duckdb_scan.py TRACE   # prints the row counts as JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import duckdb
import pyarrow as pa

TABLES = ("tokens", "spans", "steps", "requests", "gpu")


def scan(trace: Path) -> dict[str, int]:
    con = duckdb.connect(":memory:")
    parts, names = [], []
    for name in TABLES:
        path = trace / f"{name}.arrows"
        if not path.exists():
            continue
        with pa.memory_map(str(path)) as src:
            table = pa.ipc.open_stream(src).read_all()
        con.register(name, table)
        cols = ", ".join(f'min("{c}") AS "{name}.{c}"' for c in table.column_names)
        parts.append(f"(SELECT count(*) AS {name}_rows, {cols} FROM {name})")
        names.append(name)
    # every column of the result: one that is not asked for would not be computed
    res = con.execute("SELECT * FROM " + ", ".join(parts))
    row = res.fetchone()
    assert row is not None
    values = dict(zip([d[0] for d in res.description], row, strict=True))
    return {name: int(values[f"{name}_rows"]) for name in names}


if __name__ == "__main__":
    print(json.dumps(scan(Path(sys.argv[1]))))
