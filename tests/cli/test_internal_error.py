"""A bug inside a command (an exception no code path expects) is one line and exit 70, never a traceback
and never 1, which a CI gate reads as a failed threshold; TRACETOOL_TRACEBACK=1 adds the traceback to report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import analyzers.modules
from tracetool.errors import EXIT_INTERNAL, TRACEBACK_ENV

CHAT = Path(__file__).resolve().parents[2] / "sample_traces" / "chat"


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch) -> None:
    def script(*_: Any, **__: Any) -> str:  # a fault deep inside the analysis, not in the CLI
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(analyzers.modules, "script", script)


def test_a_bug_is_one_line_and_exit_70(cli: Any, broken: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    r = cli("analyze", CHAT)
    assert r.code == EXIT_INTERNAL == 70
    assert r.err.splitlines() == [f"tracetool: internal error: RuntimeError: boom second line (a bug in tracetool: "
                                  f"{TRACEBACK_ENV}=1 shows where; please report it with that)"]
    assert "Traceback" not in r.err and r.out == ""


def test_the_traceback_on_request(cli: Any, broken: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    r = cli("analyze", CHAT)
    assert r.code == EXIT_INTERNAL and "Traceback (most recent call last)" in r.err and "in script" in r.err
