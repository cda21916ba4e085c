"""The fuzz layer's summary: how many inputs each campaign tried in this run (docs/security.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The fuzz campaign is the slow tier: ``pytest -m "not slow"`` leaves it out (it runs
    seconds to tens of seconds per test at the CI budget), ``pytest`` and CI run it."""
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.slow)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.fuzz.fuzzlib import TRIED, budget

    if not TRIED:
        return
    terminalreporter.section("tracetool fuzz campaigns")
    for name, n in sorted(TRIED.items()):
        terminalreporter.write_line(f"{name:<32} {n:>8,} inputs")
    terminalreporter.write_line(f"{'total':<32} {sum(TRIED.values()):>8,} inputs "
                                f"(TRACETOOL_FUZZ_EXAMPLES={budget()})")
