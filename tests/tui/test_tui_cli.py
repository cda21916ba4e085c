"""``tracetool tui`` at the command line: help, and one clear line for every bad start."""

from __future__ import annotations

from pathlib import Path

from tui_traces import bad_trace

from tests.conftest import run_tracetool


def test_help_names_the_screens_and_keys(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("tui", "--help")
    assert r.code == 0
    for word in ("Overview", "Decode", "GPU/CPU", "Requests", "SQL", "hypothesis", "--model", "--gpu", "--theme"):
        assert word in r.out, word


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("tracetool: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_bad_trace_is_one_line_and_exit_3(tmp_path: Path) -> None:
    r = run_tracetool("tui", bad_trace(tmp_path / "bad"))
    assert r.returncode == 3
    assert "tokens.arrows" in _one_error_line(r.stderr) and r.stdout == ""


def test_missing_trace_is_exit_3(tmp_path: Path) -> None:
    r = run_tracetool("tui", tmp_path / "nowhere")
    assert r.returncode == 3 and "no such file" in _one_error_line(r.stderr)


def test_unknown_preset_is_exit_2(chat: Path) -> None:
    r = run_tracetool("tui", chat, "--gpu", "h9000")
    assert r.returncode == 2 and "unknown GPU 'h9000'" in _one_error_line(r.stderr)


def test_without_a_terminal_it_says_so(chat: Path) -> None:
    r = run_tracetool("tui", chat)  # pipes, not a TTY
    assert r.returncode == 2 and "needs an interactive terminal" in _one_error_line(r.stderr)
