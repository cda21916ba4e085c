"""Fixtures of the live tests (helpers in live_helpers.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collectors.recorder import Recorder


@pytest.fixture
def live_recorder(tmp_path: Path) -> Iterator[Callable[..., Recorder]]:
    """Start Recorders with a live endpoint on a free loopback port; all closed at teardown."""
    made: list[Recorder] = []

    def make(name: str = "trace", live: Any = "127.0.0.1:0", **kw: Any) -> Recorder:
        rec = Recorder(tmp_path / name, live=live, **kw).start()
        made.append(rec)
        return rec

    yield make
    for rec in made:
        rec.close()
