"""Fixtures of the analyzer tests: the toy trace and its connection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from analyzer_scenarios import toy_trace

import analyzers


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    return toy_trace(tmp_path / "toy")


@pytest.fixture
def toy_con(toy: Path) -> Any:
    return analyzers.connect([toy])

