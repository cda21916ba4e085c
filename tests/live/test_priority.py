"""Observers yield the CPU: the live endpoint process and ``tracetool attach`` run niced."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from collectors.recorder import Recorder
from tracetool.live.priority import OBSERVER_NICE, lower_priority, observer_priority

REPO = Path(__file__).resolve().parents[2]


def nice_of(pid: int) -> int:
    """The nice value of a process's main thread (``/proc/PID/stat`` field 19)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


def in_thread(fn: Callable[[], object]) -> object:
    """Run ``fn`` in a new thread (a nice value is per thread on Linux: the test's stays as it is)."""
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(10)
    return out[0]


def test_observer_priority_lowers_this_thread_and_restores_it() -> None:
    def body() -> tuple[int, int, int, int]:
        before = os.getpriority(os.PRIO_PROCESS, 0)
        with observer_priority(3) as now:
            inside = os.getpriority(os.PRIO_PROCESS, 0)
        return before, inside, os.getpriority(os.PRIO_PROCESS, 0), now if now is not None else -100

    before, inside, after, now = in_thread(body)  # type: ignore[misc]
    assert inside == min(19, before + 3) == now
    if os.geteuid() == 0:  # raising a priority back needs privileges
        assert after == before
    assert lower_priority(0) is None, "0 leaves the priority alone"
    assert os.getpriority(os.PRIO_PROCESS, 0) == os.getpriority(os.PRIO_PROCESS, os.getpid())


@pytest.mark.slow
def test_the_endpoint_and_the_attached_viewer_run_niced(live_recorder: Callable[..., Recorder],
                                                         tmp_path: Path) -> None:
    rec = live_recorder()
    assert rec.live is not None
    host = os.getpriority(os.PRIO_PROCESS, 0)
    assert nice_of(rec.live._proc.pid) == min(19, host + OBSERVER_NICE), "the endpoint process yields"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for extra, want in (([], min(19, host + OBSERVER_NICE)), (["--nice", "0"], host)):
        viewer = subprocess.Popen([sys.executable, "-m", "tracetool", "attach", str(rec.live.address), "--record",
                                   str(tmp_path / f"v{len(extra)}"), "--duration", "2", *extra],
                                  stderr=subprocess.PIPE, text=True, env=env)
        assert viewer.stderr is not None
        line = viewer.stderr.readline()  # "recording ADDR for 2 s into DIR": the priority is set by then
        assert "recording" in line, line
        assert nice_of(viewer.pid) == want, extra
        assert viewer.wait(60) == 0, viewer.stderr.read()


def test_an_in_process_attach_gives_the_priority_back(cli, tmp_path: Path) -> None:
    def run() -> tuple[int, int, int]:
        before = os.getpriority(os.PRIO_PROCESS, 0)
        r = cli("attach", "127.0.0.1:1", "--record", str(tmp_path / "n"), "--duration", "0.3")
        return before, os.getpriority(os.PRIO_PROCESS, 0), r.code

    before, after, code = in_thread(run)  # type: ignore[misc]
    assert code == 3, "nothing reachable to record"
    if os.geteuid() == 0:
        assert after == before
