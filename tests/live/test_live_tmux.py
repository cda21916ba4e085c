"""``tracetool attach`` in a real terminal, on a real ``tracetool serve --live`` under probe traffic.

tmux (a private server, its own socket) runs the viewer at 120x40; the test
reads the pane twice and the tokens received, shown in the header, must have
grown; ``q`` quits with exit 0. Waits poll the pane (an external process
offers no event to await), with generous deadlines for a loaded machine.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_helpers import free_port

from tests.terminal import DEADLINE_S, Tmux, tmux_server
from tests.waiting import wait_until
from tracetool.serving.demo import server_process

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]

TOKENS_RE = re.compile(r"connected · ([\d,]+) tokens")


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    with tmux_server("tracetool-live-test", "live") as t:
        yield t


def _tokens(text: str) -> int:
    m = TOKENS_RE.search(text.splitlines()[0] if text else "")
    return int(m.group(1).replace(",", "")) if m else -1


def test_attach_in_a_real_terminal_watches_tokens_grow(tmux: Tmux, tmp_path: Path) -> None:
    port = free_port()
    with server_process(tmp_path / "server", "--threads", "1", "--live", f"127.0.0.1:{port}") as (url, _):
        probe = subprocess.Popen([sys.executable, "-m", "tracetool", "probe", url, "-n", "2000",
                                  "--concurrency", "2", "--max-tokens", "16", "-q"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            status = tmp_path / "exit-status"
            command = f"{sys.executable} -m tracetool attach 127.0.0.1:{port}; echo $? > {status}; sleep 30"
            tmux.run("new-session", "-d", "-s", "live", "-x", "120", "-y", "40", command)
            first = tmux.wait_for(lambda t: _tokens(t) > 0, "tokens in the header")
            second = tmux.wait_for(lambda t: _tokens(t) > _tokens(first), "the token count to grow")
            assert _tokens(second) > _tokens(first)
            # the header can show a snapshot's counts a frame before the overview below it is painted
            # (tmux may read a frame part-written on a loaded machine): wait for both
            analysed = tmux.wait_for(lambda t: "requests" in t.splitlines()[0] and "is the bottleneck" in t,
                                     "the analysed overview")
            assert f"127.0.0.1:{port}" in analysed.splitlines()[0]
            tmux.keys("q")
            wait_until(lambda: status.exists() and status.read_text().strip(), "tracetool attach to exit on q",
                       timeout=DEADLINE_S, interval=0.1)
            assert status.read_text().strip() == "0"
            assert "Traceback" not in tmux.pane()
        finally:
            probe.kill()
            probe.wait(10)
