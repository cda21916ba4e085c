"""In a real terminal (tmux), a trace's OSC 0 does not set the window title.

The end-to-end form of the issue: ``tracetool info`` and ``tracetool tui`` on the poisoned
trace, in a private tmux server; tmux acts on OSC 0 as a terminal does (``#{pane_title}``),
so a title of ``pwned`` means the sequence reached the terminal. The pane is polled for the
command's output (an external process offers no event to await).
"""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.terminal import Tmux, tmux_server

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]


@pytest.fixture
def tmux(request: pytest.FixtureRequest) -> Iterator[Tmux]:
    with tmux_server(f"tracetool-untrusted-{request.node.name[-4:-1]}", "t") as t:
        yield t


def _title(tmux: Tmux) -> str:
    return tmux.run("display", "-p", "-t", "t", "#{pane_title}").strip()


@pytest.mark.parametrize("command", ["info", "tui"])
def test_a_trace_cannot_set_the_terminal_title(tmux: Tmux, evil: Path, command: str, tmp_path: Path) -> None:
    script = tmp_path / "run.sh"  # the trace's path holds controls: in a file, not on tmux's command line
    script.write_text(f"{shlex.quote(sys.executable)} -m tracetool {command} {shlex.quote(str(evil))}\nsleep 60\n")
    tmux.run("new-session", "-d", "-s", "t", "-x", "200", "-y", "50", f"read go; sh {shlex.quote(str(script))}")
    tmux.run("select-pane", "-t", "t", "-T", "untouched")
    assert _title(tmux) == "untouched"
    tmux.keys("go", "Enter")  # the command starts after the title is set
    if command == "info":
        tmux.wait_for(("note", "pwned"))
    else:
        tmux.wait_for("decode is the bottleneck")
        tmux.keys("4")  # request ids, and the trace's label in the header
        tmux.wait_for(("chat-0", "pwned"))
    assert _title(tmux) == "untouched", "an OSC 0 from the trace reached the terminal"
