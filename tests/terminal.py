"""A real terminal for tests: a private tmux server, one session, keys in, the pane's text out."""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tests.waiting import wait_until

DEADLINE_S = 90.0
_servers = itertools.count()


class Tmux:
    """A tmux server on its own socket (``-L``), driving the session named ``target``."""

    def __init__(self, socket: str, target: str) -> None:
        self.socket = socket
        self.target = target

    def run(self, *args: str) -> str:
        # pytest exports COLUMNS/LINES (80x24); the app would size itself by them, not by the pane.
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, env=env)
        if done.returncode:
            raise AssertionError(f"tmux {' '.join(args[:1])} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def pane(self) -> str:
        return self.run("capture-pane", "-p", "-t", self.target)

    def keys(self, *keys: str) -> None:
        for k in keys:
            self.run("send-keys", "-t", self.target, k)

    def wait_for(self, what: Callable[[str], bool] | str | tuple[str, ...], description: str | None = None,
                 deadline: float = DEADLINE_S) -> str:
        """Poll the pane until ``what`` (a text it contains, every text of a tuple, or a test) holds;
        the pane's text. Wait for all a check reads in one call: tmux can show a frame part-written,
        so one text on screen does not mean its neighbours are there yet."""
        texts = (what,) if isinstance(what, str) else what
        test = (lambda text: all(t in text for t in texts)) if isinstance(texts, tuple) else what
        shown = [""]

        def holds() -> bool:
            shown[0] = self.pane()
            return bool(test(shown[0]))

        try:
            wait_until(holds, repr(description or what), timeout=deadline, interval=0.1)
        except AssertionError as e:
            raise AssertionError(f"{e}; the pane shows:\n{shown[0]}") from None
        return shown[0]


@contextmanager
def tmux_server(name: str, target: str) -> Iterator[Tmux]:
    """A :class:`Tmux` whose server is killed afterwards, whatever happened.

    Each server gets a socket of its own: ``kill-server`` returns before the old server has let go
    of its socket, and a ``new-session`` on the same name can reach the dying server and fail."""
    t = Tmux(f"{name}-{os.getpid()}-{next(_servers)}", target)
    try:
        yield t
    finally:
        subprocess.run(["tmux", "-L", t.socket, "kill-server"], capture_output=True)
