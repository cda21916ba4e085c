"""The texts of findings and claims are written in SQL (summary.sql's macros), every other surface in
Python (tracetool.units, tracetool.glyphs): the two must print a duration, and a value not measured, alike."""

from __future__ import annotations

import duckdb
import pytest

from analyzers.modules import load
from tracetool.glyphs import NOT_MEASURED
from tracetool.units import ms


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    c = duckdb.connect()
    for stmt in load("summary").statements:
        if "CREATE OR REPLACE MACRO" in stmt:
            c.execute(stmt)
    return c


# not at a half of the last digit: printf rounds the binary double, units.fixed its decimal repr
@pytest.mark.parametrize("x", [0.0, 0.0123, 0.05, -0.07, 0.5, 4.64, 9.994, 161.04, 999.94, 12345.6, -3.2])
def test_a_duration_reads_as_on_every_other_surface(con: duckdb.DuckDBPyConnection, x: float) -> None:
    assert con.execute("SELECT _ms(?::DOUBLE)", [x]).fetchone()[0] == ms(x, micro=True)


def test_a_value_not_measured_reads_as_on_every_other_surface(con: duckdb.DuckDBPyConnection) -> None:
    for macro in ("_ms(NULL::DOUBLE)", "_pct(NULL::DOUBLE)", "_n(NULL::DOUBLE)", "_f(NULL::DOUBLE, 2)"):
        assert con.execute(f"SELECT {macro}").fetchone()[0] == NOT_MEASURED, macro
