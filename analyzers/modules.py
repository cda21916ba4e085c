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

A statement preceded by ``-- @when FLAG`` runs only when the analysis sets that flag, one
preceded by ``-- @unless FLAG`` only when it does not (:data:`FLAGS`): a choice made once per
analysis from what it is given (the memory limit, the traces' size), never per row.
"""

from __future__ import annotations

import re
from collections.abc import Collection
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

#: Flags a statement may depend on (``-- @when FLAG`` / ``-- @unless FLAG``).
#: ``spill_quantiles``: the exact per-token ITL percentiles from a table DuckDB can spill past its
#: memory limit instead of an in-memory aggregate of 8 bytes per token (analyzers.connection).
#: ``no_tail``: the tail's data tables (TAIL_MODULES but TAIL_STATIC_TABLES) are created empty, with their
#: columns, without computing them (``Session(tail=False)``, a live view's ticks).
#: ``no_gaps``: a first look (``analyze(first_look=True)``): :data:`GAPS_VIEW` has no rows, so the one pass
#: that orders each request's tokens (most of a big trace's analysis) is not made, and every figure read
#: from token gaps (ITL, host time, the step accounting, the server-side ITL fit) is null. The request-level
#: attribution (where the time went, TTFT, e2e, TPOT) is the whole analysis's.
FLAGS = ("spill_quantiles", "no_tail", "no_gaps")

#: The object that pairs each token with the one before it. A first look is completed by making this object
#: and every object read from it (:func:`gap_objects`) again, on the same connection (:func:`run_all`'s
#: ``only``): every other object is the same with and without ``no_gaps``.
GAPS_VIEW = "tokens_gaps"

#: A statement that creates a summary table: its name and its query (a Session re-runs them for each snapshot;
#: Spark's engine caches them as views).
TEMP_TABLE_RE = re.compile(r"CREATE\s+OR\s+REPLACE\s+TEMP\s+TABLE\s+(\w+)\s+AS\s+(.*)", re.S | re.I)

_OBJECT_RE = re.compile(r"^--\s*@(view|table)\s+([a-z_][a-z0-9_]*)\s*$")
_COLUMN_RE = re.compile(r"^--\s*@column\s+([a-z_][a-z0-9_]*)\s*:\s*(.+?)\s*$")
_STATEMENT_END_RE = re.compile(r";[ \t]*$", re.MULTILINE)
_CONDITION_RE = re.compile(r"^\s*--\s*@(when|unless)\s+([a-z_]+)\s*$")
_CONDITION_MARK_RE = re.compile(r"^/\*@(when|unless) ([a-z_]+)\*/\s*")


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
    #: The statements an analysis without flags runs (``-- @when`` ones left out).
    statements: tuple[str, ...]
    objects: tuple[SqlObject, ...]
    #: Every statement with its condition: (``"when"`` or ``"unless"``, flag), or None.
    parts: tuple[tuple[tuple[str, str] | None, str], ...] = ()

    def statements_for(self, flags: frozenset[str] = frozenset()) -> tuple[str, ...]:
        """The statements an analysis with ``flags`` set runs, in order."""
        return tuple(stmt for cond, stmt in self.parts if _holds(cond, flags))


@cache
def load(name: str) -> Module:
    """Read and parse ``analyzers/<name>.sql``."""
    text = resources.files("analyzers").joinpath(f"{name}.sql").read_text(encoding="utf-8")
    parts = _parts(text)
    return Module(name, text, tuple(stmt for cond, stmt in parts if _holds(cond, frozenset())),
                  _objects(name, text), parts)


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


def run_all(con: Any, disabled: str = DISABLED_OPTIMIZERS, flags: frozenset[str] = frozenset(),
            only: frozenset[str] | None = None) -> None:
    """Create every module's objects in ``con``, in dependency order; with ``only``, just those objects
    (the others exist in ``con`` already).

    The statements go to DuckDB as one script, so the calling thread gives up the GIL once
    for all of them instead of once per statement: in a process whose other threads run
    Python (the TUI, live clients), taking the GIL back after each of ~35 statements waited
    up to a switch interval (5 ms) each time, and a live view's analysis took twice as long.
    """
    con.execute(f"SET disabled_optimizers = '{disabled}'")
    try:
        con.execute(script(flags, only))
    finally:
        con.execute("RESET disabled_optimizers")


@cache
def script(flags: frozenset[str] = frozenset(), only: frozenset[str] | None = None) -> str:
    """Every module's statements for ``flags``, in run order, as one SQL script; with ``only``, the
    statements that create those objects."""
    unknown = set(flags) - set(FLAGS)
    if unknown:
        raise ValueError(f"unknown module flags: {sorted(unknown)}")
    empty = set(tail_tables()) if "no_tail" in flags else set()
    if "no_gaps" in flags:
        empty.add(GAPS_VIEW)
    stmts = [stmt for m in all_modules() for stmt in m.statements_for(flags)]
    if only is not None:  # and a statement that makes nothing (a DROP) about one of them
        stmts = [stmt for stmt in stmts if (name := _object(stmt)) in only or (name is None and _reads(stmt, only))]
    return "".join(f"{_empty(stmt) if empty and _object(stmt) in empty else stmt};\n" for stmt in stmts)


@cache
def gap_objects(flags: frozenset[str] = frozenset()) -> frozenset[str]:
    """:data:`GAPS_VIEW` and every object (table, view or macro) whose statement reads one of them, by name:
    what a first look leaves out and :func:`analyzers.connection.complete` makes. A name is matched as a
    word of the statement without its comments, so a column of the same name only adds an object (made again,
    the same), never leaves one out."""
    made = {GAPS_VIEW}
    for stmt in (stmt for m in all_modules() for stmt in m.statements_for(flags)):
        name = _object(stmt)
        if name is not None and name not in made and _reads(stmt, made):
            made.add(name)
    return frozenset(made)


def _reads(stmt: str, names: Collection[str]) -> bool:
    """Whether ``stmt`` (its comments left out) names one of ``names`` as a word."""
    code = _COMMENT_RE.sub("", stmt)
    return any(re.search(rf"\b{re.escape(n)}\b", code) for n in names)


@cache
def tail_tables() -> frozenset[str]:
    """The tables of the tail's modules that hold trace data (what ``no_tail`` leaves empty)."""
    return frozenset(name for mod in TAIL_MODULES for stmt in load(mod).statements
                     if (name := _creates(stmt)) and name not in TAIL_STATIC_TABLES)


def _creates(stmt: str) -> str | None:
    m = TEMP_TABLE_RE.match(stmt.strip())
    return m.group(1) if m else None


_VIEW_RE = re.compile(r"CREATE\s+OR\s+REPLACE\s+VIEW\s+(\w+)\s+AS\s+(.*)", re.S | re.I)
_MACRO_RE = re.compile(r"CREATE\s+OR\s+REPLACE\s+MACRO\s+(\w+)", re.I)
_COMMENT_RE = re.compile(r"--[^\n]*")


def _object(stmt: str) -> str | None:
    """The table, view or macro ``stmt`` creates."""
    m = TEMP_TABLE_RE.match(stmt.strip()) or _VIEW_RE.match(stmt.strip()) or _MACRO_RE.match(stmt.strip())
    return m.group(1) if m else None


def _empty(stmt: str) -> str:
    """The table or view ``stmt`` creates, with its columns and no rows: DuckDB plans the query and runs none
    of it (nor, for a view, does any query that reads it)."""
    if m := TEMP_TABLE_RE.match(stmt.strip()):
        return f"CREATE OR REPLACE TEMP TABLE {m.group(1)} AS SELECT * FROM ({m.group(2)}) LIMIT 0"
    m = _VIEW_RE.match(stmt.strip())
    assert m is not None
    return f"CREATE OR REPLACE VIEW {m.group(1)} AS SELECT * FROM ({m.group(2)}) LIMIT 0"


def _holds(cond: tuple[str, str] | None, flags: frozenset[str]) -> bool:
    return cond is None or (cond[1] in flags) == (cond[0] == "when")


def _parts(text: str) -> tuple[tuple[tuple[str, str] | None, str], ...]:
    """The statements of a module's text, each with its ``@when``/``@unless`` condition."""
    lines = []
    for line in text.splitlines():
        c = _CONDITION_RE.match(line)
        if c:  # kept through the comment stripping as a mark at the start of its statement
            lines.append(f"/*@{c.group(1)} {c.group(2)}*/")
        elif not line.lstrip().startswith("--"):
            lines.append(line)
    out: list[tuple[tuple[str, str] | None, str]] = []
    for part in _STATEMENT_END_RE.split("\n".join(lines)):
        part = part.strip()
        if not part:
            continue
        m = _CONDITION_MARK_RE.match(part)
        cond = (m.group(1), m.group(2)) if m else None
        if cond is not None and cond[1] not in FLAGS:
            raise ValueError(f"unknown module flag {cond[1]!r}")
        out.append((cond, part[m.end():].strip() if m else part))
    return tuple(out)


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
