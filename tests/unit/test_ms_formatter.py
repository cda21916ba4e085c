"""Durations read the same on every surface (tracetool.units), and a value that was not measured
prints tracetool.glyphs.NOT_MEASURED on each: the CLI, the TUI, the Markdown/HTML reports, the
text diff, probe's table and the sweep's."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from tracetool import units
from tracetool.glyphs import NOT_MEASURED

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("args", "kw", "out"), [
    ((4.6449,), {}, "4.64 ms"),
    ((161.04,), {}, "161.0 ms"),
    ((1234.5,), {}, "1.23 s"),          # halves round up from the shortest repr: 1.2345 -> 1.23
    ((680.65,), {}, "680.7 ms"),        # not the binary double's 680.6499...
    ((4.6449, 1), {}, "4.6 ms"),
    ((1234.5,), {"unit": False}, "1235"),
    ((12.345, 2), {"unit": False}, "12.35"),
    ((0.05,), {"micro": True}, "50.0 µs"),
    ((0.05,), {}, "0.05 ms"),
    ((3.2,), {"sign": True}, "+3.20 ms"),
    ((-3.2,), {"sign": True}, "-3.20 ms"),
    ((0.0,), {"sign": True}, "0.00 ms"),
])
def test_milliseconds(args: tuple[Any, ...], kw: dict[str, Any], out: str) -> None:
    assert units.ms(*args, **kw) == out


@pytest.mark.parametrize("kw", [{}, {"unit": False}, {"sign": True}, {"micro": True}, {"digits": 2}])
def test_not_measured_is_the_mark_in_every_variant(kw: dict[str, Any]) -> None:
    assert units.ms(None, **kw) == NOT_MEASURED
    assert units.ms(math.nan, **kw) == NOT_MEASURED


def test_every_surface_prints_the_mark_for_a_missing_value(capsys: pytest.CaptureFixture[str]) -> None:
    from tracetool.report import fmt as report_fmt
    from tracetool.report.diff import print_diff
    from tracetool.serving.metrics import format_table
    from tracetool.serving.sweep import print_sweep
    from tracetool.tui import fmt as tui_fmt

    assert tui_fmt.ms(None) == report_fmt.ms(None) == NOT_MEASURED

    row = format_table({"ttft": {"mean": None, "p50": 12.0, "p90": None, "p99": None, "n": 1}}, {"ttft": "TTFT"})[1]
    assert row.split()[1:5] == [NOT_MEASURED, "12.0", NOT_MEASURED, NOT_MEASURED]

    print_sweep({"axis": "rate", "moved": None, "best_level": None, "levels": [{
        "level": 2.0, "ok": 0, "requests": 3, "ttft_ms": {"p50": None, "p99": None}, "itl_ms": {"p50": None},
        "e2e_ms": {"p50": None, "p99": None}, "request_throughput": None, "output_token_throughput": None,
        "shares": {"decode": None}, "client_bound": None, "slo": None}]})
    sweep_row = capsys.readouterr().out.splitlines()[1].split()
    assert sweep_row[2:] == [NOT_MEASURED] * 8

    print_diff({"a": {"label": "a", "requests": 1}, "b": {"label": "b", "requests": 1}, "headline": "h", "top": None,
                "latency": [{"stat": "p50", "metric": "ttft", "a_ms": None, "b_ms": 1.0, "delta_pct": None,
                             "ci_low_pct": None, "ci_high_pct": None, "significant": False}],
                "components": [{"component": "queue", "a_ms": None, "b_ms": 2.0, "delta_ms": None, "ci_low_ms": None,
                                "ci_high_ms": None, "a_share": None, "b_share": 0.5}]})
    lines = capsys.readouterr().out.splitlines()
    assert lines[4].split() == ["p50", "TTFT", NOT_MEASURED, "1.00", NOT_MEASURED, NOT_MEASURED]
    assert lines[7].split() == ["queue", NOT_MEASURED, "2.00", NOT_MEASURED, NOT_MEASURED, NOT_MEASURED, "->",
                                "50.0", "%"]


# What a surface writes when it formats milliseconds or marks a missing value by itself: a formatter of
# its own (by name, or a ``mark if x is None else f"{x:.2f}"``), a fixed-point format of a value named
# ``…ms`` or followed by " ms" in an f-string (units.ms rounds halves up from the shortest repr; ``:.2f``
# rounds the binary double: 0.125 -> 0.12 where the text diff printed 0.13), and a dash of its own for a
# missing value (glyphs.NOT_MEASURED is the one mark).
_OWN_FORMATTER = re.compile(r"""def (_?fmt_ms|_ms|_signed_ms)\(|is None else f["']\{\w+:[+ ]?\.\d+f\}["']""")
_FIELD = re.compile(r"\{([^{}:]+):([+\- ]?[<>^=]?\d*,?\.\d+f)\}( ms\b)?")
_OWN_MARK = re.compile(r"""["']–["']|["']-["'] if [^:]* is None|is None else ["']-["']""")


def own_formats(text: str) -> list[str]:
    """The lines of one module's source that format milliseconds or the not-measured mark by hand."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        ms_fields = [m for m in _FIELD.finditer(line) if m.group(3) or re.search(r"ms\b", m.group(1))]
        if _OWN_FORMATTER.search(line) or _OWN_MARK.search(line) or ms_fields:
            found.append(f"{n}: {line.strip()}")
    return found


def test_no_surface_writes_its_own_not_measured_mark() -> None:
    """A hyphen or en dash of its own for a missing value, or a milliseconds format of its own, is how
    the surfaces drifted (the TUI's diff rounded 0.125 to 0.12 where ``tracetool diff`` printed 0.13)."""
    found = []
    for path in sorted((REPO / "tracetool").rglob("*.py")):
        if path.name == "glyphs.py":  # the mark's one definition
            continue
        found += [f"{path.relative_to(REPO)}:{x}" for x in own_formats(path.read_text())]
    assert found == []


@pytest.mark.parametrize("line", [
    # The TUI diff's cells before they used units.ms and glyphs.NOT_MEASURED:
    '    return "–" if x is None else f"{x:.2f}"',
    """comps.add_row(name, a, b, "–" if c["delta_ms"] is None else f"{c['delta_ms']:+.2f}",""",
    """top["component"] if top else "–",""",
    """def _ms(x: float | None) -> str:""",
    # a hyphen for a missing value, an own fixed-point millisecond format:
    """cell = "-" if row["p50"] is None else units.ms(row["p50"])""",
    """echo(f"step {e.decode_step_ms:.2f} ms ideal")""",
    """echo(f"worst {lag:.1f} ms")""",
    '    return NOT_MEASURED if x is None else f"{x:+.2f}"',
])
def test_the_guard_flags_a_surfaces_own_format(line: str) -> None:
    assert own_formats(line) != []


@pytest.mark.parametrize("line", [
    """echo(f"{units.ms(x['a_ms'], 2, unit=False):>11}")""",
    'return NOT_MEASURED if x is None else f"{x * 100:.1f} %"',
    'sign = "-" if fit["per_1k_kv_ms"] < 0 else "+"',
    """slug = re.sub(r"[^a-z0-9.]+", "-", label.lower()).strip("-")""",
    """echo(f"{e.kv_bytes_per_gpu / 1e9:,.2f} GB")""",
    """("time span", NOT_MEASURED if span is None else f"{span:.3f} s"),""",
    'return NOT_MEASURED if x is None else f"{x:.{d}f}"',
])
def test_the_guard_lets_the_shared_formatters_and_other_dashes_be(line: str) -> None:
    assert own_formats(line) == []
