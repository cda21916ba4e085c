"""A live viewer that vanishes mid-stream (SIGKILL, no goodbye) or stalls: the recording never notices.

``tests/live/test_slow_viewer.py`` covers a viewer that stops reading (its rows
are dropped and counted, the recorder keeps its pace); ``tests/live/test_reconnect.py``
a server that dies under its viewer. Here the viewer is a real
``tracetool attach --record`` process killed while streaming, then another one
that stalls without reading while the host closes: the host's loop never
stops, its slot is given back, a new viewer attaches and receives, the host
closes within its bound, and the trace on disk holds every row.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.flight as flight
import pytest

from collectors.recorder import Recorder
from tests.conftest import REPO
from tests.waiting import wait_until
from tracetool.live.config import LiveConfig
from tracetool.live.protocol import ticket
from tracetool.reader import open_trace


class Host:
    """A host loop recording tokens on a thread until told to stop."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.tokens = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            with self.rec.request(f"r{n}") as req:
                for i in range(200):
                    req.token(i, kv_len=i)
            self.tokens += 200
            n += 1
            self.stop.wait(0.005)


def _attach(url: str, out: Path, seconds: float) -> subprocess.Popen[str]:
    addr = url.split("://", 1)[1]
    return subprocess.Popen([sys.executable, "-m", "tracetool", "attach", addr, "--record", str(out), "--duration",
                             str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))


@pytest.mark.slow
def test_a_viewer_killed_mid_stream_and_one_that_stalls(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "t", live=LiveConfig("127.0.0.1:0", viewer_buffer_rows=10_000)).start()
    assert rec.live is not None
    host = Host(rec)
    try:
        viewer = _attach(rec.live.url, tmp_path / "v1", 60)
        wait_until(lambda: rec.live.stats()["viewers"] == 1, "the viewer to attach")
        before = host.tokens
        viewer.send_signal(signal.SIGKILL)  # no goodbye: the TCP connection just breaks
        viewer.wait(10)
        wait_until(lambda: rec.live.stats()["viewers"] == 0, "the endpoint to give the slot back")
        wait_until(lambda: host.tokens > before + 2000, "the host to go on")

        again = _attach(rec.live.url, tmp_path / "v2", 1.0)  # a new viewer attaches and receives
        _, err = again.communicate(timeout=60)
        assert again.returncode == 0, err
        assert open_trace(tmp_path / "v2", strict=True).rows("tokens") > 0

        client = flight.FlightClient(rec.live.url)  # a viewer that stalls while the host closes
        reader = client.do_get(flight.Ticket(ticket("tokens", "stalled", history=False)))
        reader.read_chunk()
        wait_until(lambda: rec.live.stats()["viewers"] == 1, "the stalled viewer to attach")
    finally:
        host.stop.set()
        host.thread.join(10)
    endpoint = rec.live
    t0 = time.monotonic()
    rec.close()
    assert time.monotonic() - t0 < endpoint.config.close_timeout_s + 5, "a stalled viewer held the host's close"
    assert rec.writer.dropped == {}
    t = open_trace(tmp_path / "t", strict=True)
    assert t.rows("tokens") == host.tokens, "the recording lost rows to its viewers"
    reader.cancel()
    client.close()
