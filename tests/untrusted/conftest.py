"""Fixtures of the untrusted-text tests: poisoned traces, and the CLI run as if on a terminal."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from tests.tui.tui_traces import chat_trace
from tests.untrusted.evil import BIDI, C1, OSC_TITLE, poison_trace

#: The payload as a folder name can hold it (no slash, no NUL): a trace's label, a group's value.
NAME_PAYLOAD = f"run{OSC_TITLE}\x1b[31m{C1}{BIDI}[bold]b<img src=x>`|"
#: Characters of the long note in the poisoned trace (its output must stay small).
BIG_NOTE = 5_000_000


@pytest.fixture(scope="session")
def evil_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("untrusted")
    chat_trace(root / "clean")
    return root


@pytest.fixture(scope="session")
def evil(evil_root: Path) -> Path:
    """The chat trace with the payload in every request id, stack, error, an extra span name and
    meta.json, in a folder whose name holds it too, with a 5,000,000-character note."""
    return poison_trace(evil_root / "clean", evil_root / NAME_PAYLOAD, big_note_chars=BIG_NOTE)


@pytest.fixture(scope="session")
def evil_dataset(evil_root: Path, evil: Path) -> Path:
    """A dataset of two poisoned traces under ``server=<payload>/`` and ``server=b/``."""
    root = evil_root / "dataset"
    for value in (NAME_PAYLOAD, "b"):
        poison_trace(evil_root / "clean", root / f"server={value}" / "t")
    return root


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """click writes as it does to a terminal: it strips 7-bit CSI when stdout is not a tty, which
    would hide from a test what a user's terminal receives."""
    monkeypatch.setattr(click.utils, "should_strip_ansi", lambda *a, **k: False)
    yield
