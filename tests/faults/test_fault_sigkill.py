"""SIGKILL of a recording process at random moments: every row that reached the disk survives, the trace validates.

``tests/unit/test_sigkill.py`` kills a bare writer; here the recording
processes are the real ones: an unmodified Hugging Face program under
``tracetool record``, and ``tracetool serve`` under ``tracetool probe``
traffic. While each runs, the test reads the trace as any reader would
and remembers every token row it saw; after the kill at a random moment,
``tracetool validate`` passes and every remembered row is still there.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_tracetool
from tests.waiting import wait_until
from tracetool.errors import TracetoolError
from tracetool.reader import open_trace
from tracetool.serving.demo import server_process

SCRIPT = Path(__file__).resolve().parent / "scripts" / "generate_loop.py"


def _seen(trace: Path) -> tuple[set[tuple[str, int]], int]:
    """Token rows (request id, index) and span rows a reader finds on disk right now."""
    try:
        t = open_trace(trace)
    except TracetoolError:  # meta.json not written yet
        return set(), 0
    tokens = t.table("tokens")
    return set(zip(tokens.column("request_id").to_pylist(), tokens.column("index").to_pylist(), strict=True)), \
        t.rows("spans")


def _watch(trace: Path, rng: random.Random) -> tuple[set[tuple[str, int]], int]:
    """Read the growing trace until rows appear, then for a random while longer (the kill's moment
    is the test's dice, not a wait); what was seen last."""
    wait_until(lambda: _seen(trace)[0], f"rows in {trace}", timeout=120, interval=0.05)
    stop_at = time.monotonic() + rng.uniform(0, 1.5)
    seen, spans = _seen(trace)
    while time.monotonic() < stop_at:
        time.sleep(0.05)
        seen, spans = _seen(trace)
    return seen, spans


def _after_kill(trace: Path, seen: set[tuple[str, int]], spans: int) -> None:
    r = run_tracetool("validate", "--json", trace)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["closed"] is False
    t = open_trace(trace, strict=True)
    tokens = t.table("tokens")
    now = set(zip(tokens.column("request_id").to_pylist(), tokens.column("index").to_pylist(), strict=True))
    lost = seen - now
    assert not lost, f"{len(lost)} token rows a reader saw before the kill are gone: {sorted(lost)[:5]}"
    assert t.rows("spans") >= spans


@pytest.mark.slow
def test_sigkill_of_a_recorded_hf_program(tmp_path: Path) -> None:
    rng = random.Random(20240610)
    for attempt in range(2):
        out = tmp_path / f"t{attempt}"
        rec = subprocess.Popen([sys.executable, "-m", "tracetool", "record", "-o", str(out), "--",
                                sys.executable, str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        try:
            assert rec.stdout is not None
            pid = int(rec.stdout.readline().split()[1])  # the recorded program (the recording process)
            seen, spans = _watch(out, rng)
            os.kill(pid, signal.SIGKILL)
            _, err = rec.communicate(timeout=60)
        finally:
            if rec.poll() is None:
                rec.kill()
        assert rec.returncode == 128 + signal.SIGKILL, err  # record exits with the program's fate
        assert "recording not closed: the program was killed; flushed rows are readable" in err, err
        assert "Traceback" not in err
        _after_kill(out, seen, spans)


@pytest.mark.slow
def test_sigkill_of_serve_under_probe_traffic(tmp_path: Path) -> None:
    rng = random.Random(7)
    for attempt in range(2):
        trace = tmp_path / f"server{attempt}"
        with server_process(trace, "--threads", "1", "--max-batch", "4") as (url, proc):
            probe = subprocess.Popen([sys.executable, "-m", "tracetool", "probe", url, "-n", "200",
                                      "--concurrency", "4", "--max-tokens", "32", "--ignore-eos", "--timeout", "20",
                                      "-q", "--json", "-o", str(tmp_path / f"client{attempt}")],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                seen, spans = _watch(trace, rng)
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
                out, err = probe.communicate(timeout=120)  # the rest of the run meets a dead port
            finally:
                if probe.poll() is None:
                    probe.kill()
        assert probe.returncode == 0, err  # the run completed: failures are data
        rep: dict[str, Any] = json.loads(out)
        assert rep["requests"] == 200 and rep["failed"] >= 1
        assert all(e["error"].startswith(("connection closed", "connect failed")) for e in rep["errors"]), \
            rep["errors"]
        _after_kill(trace, seen, spans)
        client = open_trace(tmp_path / f"client{attempt}", strict=True)
        assert client.rows("requests") == 200
