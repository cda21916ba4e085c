"""The fuzz layer's summary: how many inputs each campaign tried in this run (docs/security.md)."""

from __future__ import annotations

from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.fuzz.fuzzlib import TRIED, budget

    if not TRIED:
        return
    terminalreporter.section("tracetool fuzz campaigns")
    for name, n in sorted(TRIED.items()):
        terminalreporter.write_line(f"{name:<32} {n:>8,} inputs")
    terminalreporter.write_line(f"{'total':<32} {sum(TRIED.values()):>8,} inputs "
                                f"(TRACETOOL_FUZZ_EXAMPLES={budget()})")
