"""``tracetool tui`` in a real terminal: tmux runs it, we send keys and read the pane like a user.

The tmux server is private to the test (its own socket), so it never touches a
user's sessions. Waits poll the pane until the text appears (an external process
offers no event to await), with a generous deadline for a loaded machine.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.terminal import DEADLINE_S, Tmux, tmux_server
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    with tmux_server("tracetool-test", "tui") as t:
        yield t


def test_tui_in_a_real_terminal(tmux: Tmux, chat: Path, tmp_path: Path) -> None:
    status = tmp_path / "exit-status"
    command = f"{sys.executable} -m tracetool tui {chat}; echo $? > {status}; sleep 30"
    tmux.run("new-session", "-d", "-s", "tui", "-x", "120", "-y", "40", command)
    tmux.wait_for("decode is the bottleneck: 92.2 % of e2e")
    # the Diagnosis panel, beside the waterfall at 120 columns
    tmux.wait_for(("✗ network RTT", "Where the time went", "Diagnosis · the usual suspects", "1 Overview",
                   "q Quit", "✓ decode"))
    assert tmux.run("display", "-p", "-t", "tui", "#{window_width}x#{window_height}").strip() == "120x40"
    tmux.keys("2")
    tmux.wait_for(("x: kv_len (tokens)", "ITL over token index"))
    tmux.keys("4")
    tmux.wait_for("chat-05")
    tmux.keys("Enter")
    tmux.wait_for(("client.request", "request  chat-05", "server.request"))
    # Escape and the next key must not arrive together (ESC + h reads as Alt+h, as in any terminal).
    tmux.keys("Escape")
    tmux.wait_for("enter opens one")
    tmux.keys("h")
    tmux.wait_for("Test a hypothesis")
    tmux.keys("Down", "Enter")
    tmux.wait_for("MISDIAGNOSIS")
    tmux.keys("Escape")
    tmux.wait_for(lambda text: "Test a hypothesis" not in text)
    tmux.keys("5")
    tmux.wait_for("read-only")
    for ch in "SELECT count(*) AS n FROM tokens":
        tmux.keys(ch if ch != " " else "Space")
    tmux.keys("Enter")
    tmux.wait_for(lambda text: "1 rows" in text and "2680" in text.replace(",", ""))
    tmux.keys("Escape")
    tmux.wait_for(lambda text: "Stop / leave input" in text and "Quit" in text)  # the input let go of the keys
    tmux.keys("q")
    wait_until(lambda: status.exists() and status.read_text().strip(), "tracetool tui to exit on q", timeout=DEADLINE_S,
               interval=0.1)
    assert status.read_text().strip() == "0"
    assert "Traceback" not in tmux.pane()


def test_tui_bad_trace_in_a_real_terminal(tmux: Tmux, tmp_path: Path) -> None:
    from tui_traces import bad_trace

    status = tmp_path / "exit-status"
    bad = bad_trace(tmp_path / "bad")
    tmux.run("new-session", "-d", "-s", "tui", "-x", "80", "-y", "24",
             f"{sys.executable} -m tracetool tui {bad}; echo $? > {status}; sleep 30")
    text = tmux.wait_for("tracetool: error:")
    wait_until(lambda: status.exists() and status.read_text().strip(), "the exit status", timeout=DEADLINE_S,
               interval=0.1)
    assert status.read_text().strip() == "3"
    assert "Traceback" not in text and "tokens.arrows" in text


def test_tui_group_picker_in_a_real_terminal(tmux: Tmux, tmp_path: Path) -> None:
    """A two-server dataset: g opens the picker, the arrow keys and enter pick server=b, and the
    header says so with that group's own request count."""
    from tui_traces import two_servers

    from analyzers.fleet import analyze_dataset

    ds = two_servers(tmp_path / "fleet")
    want = {tuple(g["group"].items()): g for g in analyze_dataset([ds]).to_json()["groups"]}[(("server", "b"),)]
    status = tmp_path / "exit-status"
    tmux.run("new-session", "-d", "-s", "tui", "-x", "120", "-y", "40",
             f"{sys.executable} -m tracetool tui {ds}; echo $? > {status}; sleep 30")
    tmux.wait_for(("all · 3 traces", "g Group"))
    tmux.keys("g")
    tmux.wait_for(("Pick a group", "server=a", "server=b", "2 traces"))
    tmux.keys("Down", "Down", "Enter")
    text = tmux.wait_for(lambda t: "server=b · 1 trace" in t.splitlines()[0]
                         and f"{want['requests']} requests" in t.splitlines()[0] and "analysing" not in t)
    assert "Pick a group" not in text
    tmux.keys("q")
    wait_until(lambda: status.exists() and status.read_text().strip(), "tracetool tui to exit on q", timeout=DEADLINE_S,
               interval=0.1)
    assert status.read_text().strip() == "0"
