"""Every analyzer object is documented, and its documented columns are exactly DESCRIBE's."""

from __future__ import annotations

import re
from typing import Any

import pytest

import analyzers
from analyzers.modules import MODULES, documented_objects, load
from tracetool.schema import TABLES

INPUT_VIEWS = set(TABLES)  # the trace tables themselves (docs/trace-format.md)
#: Words a column's doc must contain for the unit its name ends with.
UNITS = {"_ms": "milliseconds", "_ns": "nanoseconds", "_s": "seconds", "_pct": "percent", "_bytes": "bytes",
         "_tok_s": "tokens per second", "_w": "watts", "_share": "0..1", "_per_s": "per second"}


def test_every_public_object_is_documented_with_its_exact_columns(toy_con: Any) -> None:
    docs = documented_objects()
    assert docs, "no documented objects found"
    for name, obj in docs.items():
        described = [r[0] for r in toy_con.execute(f"DESCRIBE {name}").fetchall()]
        documented = [c for c, _ in obj.columns]
        assert documented == described, f"{obj.module}.sql: {name} documents {documented}, DESCRIBE says {described}"


def test_no_undocumented_public_objects(toy_con: Any) -> None:
    names = {r[0] for r in toy_con.execute(
        "SELECT table_name FROM information_schema.tables").fetchall()}
    public = {n for n in names if not n.startswith("_")} - INPUT_VIEWS
    assert public == set(documented_objects()), "objects without a doc block, or docs without an object"


@pytest.mark.parametrize("module", MODULES)
def test_public_names_carry_their_module_prefix(module: str) -> None:
    for obj in load(module).objects:
        assert obj.name == module or obj.name.startswith(module + "_"), obj.name
        assert obj.doc, f"{obj.name} has no description"
        assert obj.kind in ("view", "table")


def test_every_column_says_what_it_means_and_its_unit() -> None:
    for obj in documented_objects().values():
        for col, doc in obj.columns:
            assert len(doc) > 8, f"{obj.name}.{col}: doc too short"
            for suffix, word in UNITS.items():
                if col.endswith(suffix) and not (suffix == "_s" and col.endswith(("_ms", "_ns", "_tok_s",
                                                                                     "_per_s"))):
                    assert word in doc, f"{obj.name}.{col}: doc must name its unit ({word})"


def test_module_objects_are_created_in_order_and_sql_parses() -> None:
    for module in MODULES:
        m = load(module)
        assert m.statements, module
        for obj in m.objects:
            created = [s for s in m.statements if re.search(rf"\b(VIEW|TABLE)\s+{obj.name}\b", s)]
            assert len(created) == 1, f"{obj.name}: created {len(created)} times in {module}.sql"


def test_connection_has_external_access_disabled(toy_con: Any) -> None:
    import duckdb

    with pytest.raises(duckdb.Error):
        toy_con.execute("SELECT * FROM read_csv('/etc/passwd')").fetchall()
    with pytest.raises(duckdb.Error):
        toy_con.execute("SET enable_external_access = true")


def test_connect_accepts_paths_and_names_tables(toy: Any) -> None:
    con = analyzers.connect(str(toy))
    assert con.execute("SELECT DISTINCT trace FROM tokens").fetchall() == [("toy",)]
    assert con.execute("SELECT count(*) FROM tokens_gaps").fetchall() == [(5,)]
