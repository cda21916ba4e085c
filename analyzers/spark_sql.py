"""The analyzer modules in Spark SQL: DuckDB's dialect translated with sqlglot.

Every statement of ``analyzers/*.sql`` goes through :func:`translate`: sqlglot
parses it as DuckDB SQL and writes it as Spark SQL (casts, ``FILTER``, list and
struct literals, ``arg_max``, 1-based list subscripts, ``unnest``...). What
sqlglot cannot translate is replaced here by hand, each rule small and listed in
docs/fleet.md ("Spark: what is not a translation"):

* **an ASOF join** (``gpu_decode``): an ``EXISTS`` over the merged decode windows,
  written in DuckDB SQL in :data:`REWRITES` and checked against the original there;
* **macros** (``CREATE MACRO``): Spark SQL has none; each call is replaced by the
  macro's body with its arguments substituted (inlined before translation);
* **temporary tables**: a temporary view that Spark caches (``CACHE TABLE``);
* **``* EXCLUDE (a, b)``**: a regex column (```(?!(a|b)$).+```, Spark's
  ``spark.sql.parser.quotedRegexColumnNames``);
* **``quantile_cont(x, [..])``**: ``percentile(x, array(..))`` (the same linear
  interpolation between order statistics);
* **``unnest(list of structs, recursive := true)``**: ``inline`` (a column per field);
* **``len`` of a list**: ``size`` (Spark's ``length`` is for strings);
* **``favg``/``fsum``** (DuckDB's compensated sums): ``avg``/``sum``;
* **``json_valid(x)``**: ``get_json_object(x, '$') IS NOT NULL`` (Spark reads invalid JSON as NULL);
* **``isinf(x)``**: ``abs(x) = CAST('Infinity' AS DOUBLE)``;
* **``format('{:,.0f}', x)``**: ``format_number(x, 0)``;
* **a correlated ``VALUES`` list** (one row picked by ``ORDER BY .. LIMIT 1``):
  Spark evaluates no outer column in an inline table, so the rows become an array
  of structs, filtered and sorted by lambdas, and the first is taken;
* **a scalar subquery in a grouped projection** (one value per group): wrapped in
  ``first()``, as Spark requires;
* **``printf``** with a NULL argument is NULL in DuckDB and the text ``null`` in
  Spark's ``format_string``: a ``CASE`` keeps it NULL.

Nothing here imports pyspark: the translation is plain text, testable anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp

from analyzers.modules import TEMP_TABLE_RE

_MACRO_RE = re.compile(r"CREATE\s+OR\s+REPLACE\s+MACRO\s+(\w+)\s*\(([^)]*)\)\s+AS\s+(.*)", re.S | re.I)
_VIEW_RE = re.compile(r"CREATE\s+OR\s+REPLACE\s+VIEW\s+(\w+)\s+AS\s+(.*)", re.S | re.I)
_EXCLUDE_RE = re.compile(r"(\b\w+\.)?\*\s+EXCLUDE\s*\(([^)]*)\)", re.I)


#: Statement parts with no Spark translation, and their hand-written DuckDB equivalents (which
#: then go through the translation like the rest). A test runs each statement both ways in
#: DuckDB and compares the results, and fails when the original text is no longer there.
REWRITES: dict[str, tuple[str, str]] = {
    # ASOF join (the latest decode window starting before the sample): windows are merged, so
    # they never overlap, and "inside the latest window that started" is "inside some window".
    "gpu_decode": (
        """    SELECT s.*, w.end_ns IS NOT NULL AND s.ts_ns <= w.end_ns AS in_decode
    FROM s ASOF LEFT JOIN gpu_windows AS w ON s.trace = w.trace AND s.ts_ns >= w.start_ns""",
        """    SELECT s.*, EXISTS (SELECT 1 FROM gpu_windows AS w
                        WHERE w.trace = s.trace AND s.ts_ns >= w.start_ns AND s.ts_ns <= w.end_ns) AS in_decode
    FROM s"""),
    # ASOF join (a token without step_id finds the steps row that started last at or before its
    # step start): a range join keeping, per token, the row with the latest start. Quadratic per
    # trace in the tokens that need it, and those are only tokens written without step ids.
    "tokens_gaps": (
        """            ASOF LEFT JOIN (SELECT trace, start_ns, end_ns, seq, dur_ns, slowed_ns FROM _steps_seq
                            WHERE (SELECT count(*) FROM tokens
                                   WHERE step_id IS NULL AND step_start_ns IS NOT NULL) > 0) AS s
                ON s.trace = t.trace AND t.step_start_ns >= s.start_ns""",
        """            LEFT JOIN (SELECT tt.trace, tt.request_id, tt.index, max_by(ss.seq, ss.start_ns) AS seq
                       FROM (SELECT trace, request_id, index, step_start_ns FROM tokens
                             WHERE step_id IS NULL AND step_start_ns IS NOT NULL) AS tt
                       JOIN _steps_seq AS ss ON ss.trace = tt.trace AND ss.start_ns <= tt.step_start_ns
                       GROUP BY tt.trace, tt.request_id, tt.index) AS m
                ON m.trace = t.trace AND m.request_id = t.request_id AND m.index = t.index
            LEFT JOIN _steps_seq AS s ON s.seq = m.seq"""),
}


def rewrite(sql: str) -> str:
    """``sql`` with the :data:`REWRITES` of the object it creates applied (DuckDB SQL still)."""
    m = re.match(r"CREATE\s+OR\s+REPLACE\s+(?:TEMP\s+TABLE|VIEW)\s+(\w+)", sql.strip(), re.I)
    if m and m.group(1) in REWRITES:
        old, new = REWRITES[m.group(1)]
        if old not in sql:
            raise ValueError(f"{m.group(1)}: the statement changed; update analyzers.spark_sql.REWRITES")
        sql = sql.replace(old, new)
    return sql


@dataclass
class Macro:
    params: list[str]
    body: exp.Expression


@dataclass
class Translator:
    """Translates the modules' statements in order (macros defined earlier are inlined later)."""

    macros: dict[str, Macro] = field(default_factory=dict)

    def statement(self, sql: str) -> list[str]:
        """Spark SQL statements doing what the DuckDB statement ``sql`` does (none for a macro)."""
        sql = rewrite(sql.strip().rstrip(";"))
        m = _MACRO_RE.match(sql)
        if m:
            params = [p.strip() for p in m.group(2).split(",") if p.strip()]
            body = self._inline(sqlglot.parse_one(m.group(3), read="duckdb"))
            self.macros[m.group(1).lower()] = Macro(params, body)
            return []
        m = TEMP_TABLE_RE.match(sql)
        if m:
            name = m.group(1)
            return [f"CACHE TABLE {name} AS {self.query(m.group(2))}"]
        m = _VIEW_RE.match(sql)
        if m:
            return [f"CREATE OR REPLACE TEMPORARY VIEW {m.group(1)} AS {self.query(m.group(2))}"]
        return [self.query(sql)]

    def query(self, sql: str) -> str:
        """A DuckDB query as Spark SQL."""
        sql, excluded = _mark_excludes(sql)
        tree = self._inline(sqlglot.parse_one(sql, read="duckdb"))
        tree = _bottom_up(tree, _replace_functions)
        tree = _bottom_up(tree, lambda n: _correlated_values(n, excluded))
        tree = _bottom_up(tree, _grouped_subqueries)
        out = tree.sql(dialect="spark")
        for marker, text in excluded.items():
            out = out.replace(marker, text)
        return out

    def _inline(self, tree: Any) -> Any:  # sqlglot's node type is Expr or Expression by version
        def sub(node: exp.Expression) -> exp.Expression:
            name = _call_name(node)
            macro = self.macros.get(name or "")
            if macro is None:
                return node
            args = list(node.expressions) if isinstance(node, exp.Anonymous) else _args(node)
            if len(args) != len(macro.params):
                raise ValueError(f"macro {name}: {len(args)} arguments for {len(macro.params)} parameters")
            binding = dict(zip(macro.params, args, strict=True))

            def bind(n: exp.Expression) -> exp.Expression:
                if isinstance(n, exp.Column) and not n.table and n.name in binding:
                    return exp.Paren(this=binding[n.name].copy())
                return n

            return exp.Paren(this=macro.body.copy().transform(bind))  # a macro's value is one operand

        return tree.transform(sub)


def _bottom_up(tree: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply ``fn`` to every node, children before parents (a replaced node's arguments are
    already replaced; ``Expression.transform`` does not descend into what it returns)."""
    for node in reversed(list(tree.walk(bfs=True))):
        new = fn(node)
        if new is not node:
            if node is tree:
                tree = new
            else:
                node.replace(new)
    return tree


def _call_name(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return None


def _args(node: exp.Expression) -> list[exp.Expression]:
    return [v for v in node.args.values() if isinstance(v, exp.Expression)]


def _mark_excludes(sql: str) -> tuple[str, dict[str, str]]:
    """``t.* EXCLUDE (a, b)`` -> a placeholder column, later the Spark regex column selecting the rest."""
    found: dict[str, str] = {}

    def repl(m: re.Match[str]) -> str:
        marker = f"__tt_exclude_{len(found)}"
        cols = "|".join(re.escape(c.strip().strip('"')) for c in m.group(2).split(",") if c.strip())
        prefix = m.group(1) or ""
        found[marker] = f"`(?!({cols})$).+`"
        return f"{prefix}{marker}"

    return _EXCLUDE_RE.sub(repl, sql), found


def _correlated_values(node: exp.Expression, placeholders: dict[str, str]) -> exp.Expression:
    """``(SELECT v.k FROM (VALUES (..), ..) AS v(..) [WHERE ..] ORDER BY .. LIMIT 1)`` whose rows
    read columns of the outer query (Spark evaluates no outer column in an inline table) ->
    the first element of the rows as an array of structs, filtered and sorted by lambdas."""
    if not isinstance(node, exp.Subquery) or not isinstance(node.this, exp.Select):
        return node
    sel = node.this
    src = sel.args.get("from_") or sel.args.get("from")
    values = src.this if src is not None else None
    if not isinstance(values, exp.Values) or not list(values.find_all(exp.Column)):
        return node
    limit = sel.args.get("limit")
    if limit is None or limit.expression is None or limit.expression.name != "1" or len(sel.expressions) != 1:
        raise ValueError(f"correlated VALUES not of the one-row form: {sel.sql()[:120]}")
    alias = values.alias_or_name
    cols = [c.name for c in values.args["alias"].columns]

    def over(e: exp.Expression, var: str) -> str:
        return e.copy().transform(lambda n: exp.column(n.name, table=var)
                                  if isinstance(n, exp.Column) and n.table == alias else n).sql(dialect="spark")

    rows = []
    for tup in values.expressions:
        parts = [f"'{name}', {v.sql(dialect='spark')}" for name, v in zip(cols, tup.expressions, strict=True)]
        rows.append(f"named_struct({', '.join(parts)})")
    arr = f"array({', '.join(rows)})"
    where = sel.args.get("where")
    if where is not None:
        arr = f"filter({arr}, x -> {over(where.this, 'x')})"
    order = sel.args.get("order")
    if order is not None:
        cases = []
        for o in order.expressions:
            a, b = over(o.this, "a"), over(o.this, "b")
            lo, hi = ("1", "-1") if o.args.get("desc") else ("-1", "1")
            cases.append(f"WHEN {a} < {b} THEN {lo} WHEN {a} > {b} THEN {hi}")
        arr = f"array_sort({arr}, (a, b) -> CASE {' '.join(cases)} ELSE 0 END)"
    marker = f"__tt_expr_{len(placeholders)}"
    placeholders[marker] = f"element_at({arr}, 1).{sel.expressions[0].name}"
    return exp.column(marker)


def _grouped_subqueries(node: exp.Expression) -> exp.Expression:
    """A scalar subquery in the projection of a grouped SELECT (correlated on the group's keys,
    so one value per group): Spark asks for it inside an aggregate, ``first()``."""
    if not isinstance(node, exp.Select) or not node.args.get("group"):
        return node
    for proj in node.expressions:
        inner = proj.this if isinstance(proj, exp.Alias) else proj
        if isinstance(inner, exp.Subquery):
            inner.replace(exp.Anonymous(this="first", expressions=[inner.copy()]))
    return node


def _replace_functions(node: exp.Expression) -> exp.Expression:
    """The hand-written replacements for what sqlglot does not translate (module docstring)."""
    name = _call_name(node)
    if isinstance(node, exp.Explode) and any(isinstance(e, exp.PropertyEQ) and e.this.name == "recursive"
                                             for e in node.expressions):
        return exp.Anonymous(this="inline", expressions=[node.this])
    if isinstance(node, exp.Length) and node.this.key.startswith("array"):
        return exp.Anonymous(this="size", expressions=[node.this])
    if isinstance(node, exp.IgnoreNulls) and isinstance(node.this, exp.AnyValue):
        # any_value(x) IGNORE NULLS cannot take a FILTER in Spark's grammar; any_value(x, true) can
        return exp.Anonymous(this="any_value", expressions=[node.this.this, exp.Boolean(this=True)])
    if isinstance(node, exp.Anonymous) and name == "json_valid":  # Spark reads invalid JSON as NULL
        return exp.Not(this=exp.Is(this=exp.Anonymous(this="get_json_object", expressions=[
            node.expressions[0], exp.Literal.string("$")]), expression=exp.Null()))
    if isinstance(node, exp.IsInf):  # no isinf in Spark SQL
        return exp.EQ(this=exp.Abs(this=node.this), expression=exp.Cast(
            this=exp.Literal.string("Infinity"), to=exp.DataType.build("double")))
    if isinstance(node, exp.Anonymous) and name in ("favg", "fsum"):
        fn = exp.Avg if name == "favg" else exp.Sum
        return fn(this=node.expressions[0])
    if isinstance(node, (exp.Quantile, exp.PercentileCont)):
        args = _args(node)
        return exp.Anonymous(this="percentile", expressions=args)
    if isinstance(node, exp.Format) or (isinstance(node, exp.Anonymous) and name == "format"):
        fmt, *rest = list(node.expressions) if isinstance(node, exp.Anonymous) else [node.this, *node.expressions]
        if isinstance(fmt, exp.Literal) and fmt.this == "{:,.0f}" and len(rest) == 1:
            return exp.Anonymous(this="format_number", expressions=[rest[0], exp.Literal.number(0)])
        raise ValueError(f"format({fmt.sql()}): no Spark replacement")
    if name == "printf" or (isinstance(node, exp.Anonymous) and name == "format_string"):
        args = list(node.expressions) if isinstance(node, exp.Anonymous) else _args(node)
        values = args[1:]
        if values:
            cond = exp.or_(*(exp.Is(this=v.copy(), expression=exp.Null()) for v in values))
            call = exp.Anonymous(this="format_string", expressions=[a.copy() for a in args])
            return exp.Case(ifs=[exp.If(this=cond, true=exp.Null())], default=call)
    return node


def translate_script(statements: list[str]) -> list[str]:
    """Every statement of the modules, in order, as Spark SQL."""
    t = Translator()
    return [s for stmt in statements for s in t.statement(stmt)]


__all__ = ["Translator", "translate_script"]
