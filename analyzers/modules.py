"""The SQL modules: loading them, their documented objects, running them in order.

Analyses live in ``analyzers/<module>.sql`` (Perfetto stdlib style). Each public
object (view or temp table) is preceded by a comment block::

    -- @view tokens_gaps            (or @table NAME)
    -- One line or more saying what one row is.
    -- @column trace: Trace label.
    -- @column itl_ms: Inter-token latency, milliseconds.
    CREATE OR REPLACE VIEW tokens_gaps AS ...;

Public names start with the module's name; helpers start with ``_`` and need no
docs. A test compares every documented column list with ``DESCRIBE`` of the
object, so the comments cannot drift from the SQL. Statements end with ``;`` at
the end of a line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

#: Run order: each module may use the objects of the modules before it.
MODULES = ("tokens", "attribution", "latency", "steps", "decode", "roofline", "host", "gpu",
           "stacks", "network", "summary", "engine", "tail", "tail_findings",
           "findings", "claims")

#: Modules a live view's session may leave out (``Session(tail=False)``): the tail compares the slow requests
#: with typical ones, which a window refreshed several times a second does not need at every tick, and its
#: statements cost a small analysis about a third more. Their tables stay, empty, except the static ones.
TAIL_MODULES = ("tail", "tail_findings")
#: Tables of those modules that hold no trace data (lists and catalogues): kept as they are.
TAIL_STATIC_TABLES = ("_tail_parts", "_tail_feature_names", "tail_findings_catalogue")

_OBJECT_RE = re.compile(r"^--\s*@(view|table)\s+([a-z_][a-z0-9_]*)\s*$")
_COLUMN_RE = re.compile(r"^--\s*@column\s+([a-z_][a-z0-9_]*)\s*:\s*(.+?)\s*$")
_STATEMENT_END_RE = re.compile(r";[ \t]*$", re.MULTILINE)


@dataclass(frozen=True)
class SqlObject:
    """A documented view or table of a module: its name, kind, what a row is, its columns."""

    module: str
    name: str
    kind: str  # "view" or "table"
    doc: str
    columns: tuple[tuple[str, str], ...]  # (name, meaning with unit)


@dataclass(frozen=True)
class Module:
    name: str
    text: str
    statements: tuple[str, ...]
    objects: tuple[SqlObject, ...]


@cache
def load(name: str) -> Module:
    """Read and parse ``analyzers/<name>.sql``."""
    text = resources.files("analyzers").joinpath(f"{name}.sql").read_text(encoding="utf-8")
    return Module(name, text, _statements(text), _objects(name, text))


def all_modules() -> tuple[Module, ...]:
    return tuple(load(m) for m in MODULES)


def documented_objects() -> dict[str, SqlObject]:
    """Every public object of every module, by name."""
    return {o.name: o for m in all_modules() for o in m.objects}


#: Optimizer passes switched off while the modules build their objects. On a small trace,
#: planning, not execution, is most of the time, and the join-order search was a large part of
#: it: every join here is per-request or per-trace tables joined on keys, written in a sensible
#: order, so the search finds nothing better (big traces got faster too; commit 854abe5 has the
#: figures). Queries a user types in the SQL console run with every pass on.
DISABLED_OPTIMIZERS = "join_order"
#: For small traces (analyzers.connection.SINGLE_THREAD_ROWS), where the optimizer's passes cost
#: more than they save: common subexpressions, expression rewriting, statistics and common
#: subplans off as well. Same results (the analysis JSON compared byte for byte on the samples
#: and generated traces) for less CPU per analysis, which is what a live view's rate is made of.
SMALL_DISABLED_OPTIMIZERS = "join_order,common_subexpressions,statistics_propagation,expression_rewriter,common_subplan"


def run_all(con: Any, disabled: str = DISABLED_OPTIMIZERS) -> None:
    """Create every module's objects in ``con``, in dependency order.

    The statements go to DuckDB as one script, so the calling thread gives up the GIL once
    for all of them instead of once per statement: in a process whose other threads run
    Python (the TUI, live clients), taking the GIL back after each of ~35 statements waited
    up to a switch interval (5 ms) each time, and a live view's analysis took twice as long.
    """
    con.execute(f"SET disabled_optimizers = '{disabled}'")
    try:
        con.execute(script())
    finally:
        con.execute("RESET disabled_optimizers")


@cache
def script() -> str:
    """Every module's statements, in run order, as one SQL script."""
    return "".join(f"{stmt};\n" for m in all_modules() for stmt in m.statements)


def _statements(text: str) -> tuple[str, ...]:
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    parts = _STATEMENT_END_RE.split(body)
    return tuple(p.strip() for p in parts if p.strip())


def _objects(module: str, text: str) -> tuple[SqlObject, ...]:
    out: list[SqlObject] = []
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        m = _OBJECT_RE.match(line.strip())
        if m:
            if current:
                out.append(_finish(module, current))
            current = {"kind": m.group(1), "name": m.group(2), "doc": [], "columns": []}
            continue
        if current is None:
            continue
        c = _COLUMN_RE.match(line.strip())
        if c:
            current["columns"].append((c.group(1), c.group(2)))
        elif line.startswith("--") and not current["columns"]:
            current["doc"].append(line[2:].strip())
        elif not line.startswith("--"):
            out.append(_finish(module, current))
            current = None
    if current:
        out.append(_finish(module, current))
    return tuple(out)


def _finish(module: str, d: dict[str, Any]) -> SqlObject:
    return SqlObject(module, d["name"], d["kind"], " ".join(x for x in d["doc"] if x).strip(),
                     tuple(d["columns"]))
