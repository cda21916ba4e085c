"""--live on ``record`` and ``serve``: flags checked before anything starts, the endpoint wired into
the recording process, and a recording process that exits promptly even with a stalled viewer."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.flight as flight
import pytest
from live_helpers import connect, free_port, wait_until

from tracetool.live.client import CONNECTED
from tracetool.live.protocol import parse_address, ticket
from tracetool.reader import open_trace

REPO = Path(__file__).resolve().parents[2]
WAIT_SCRIPT = REPO / "tests" / "collectors" / "scripts" / "wait_for_signal.py"


def test_bad_live_flags_are_usage_errors(cli, tmp_path: Path) -> None:
    r = cli("serve", "--live", "nohost", "-o", str(tmp_path / "s"))
    assert r.code == 2 and "--live: 'nohost' is not HOST:PORT" in r.err
    r = cli("serve", "--live-tls-cert", str(tmp_path / "c.pem"), "-o", str(tmp_path / "s"))
    assert r.code == 2 and "need --live" in r.err
    r = cli("record", "-o", str(tmp_path / "r"), "--live", ":0", "--live-tls-cert", str(tmp_path / "c.pem"),
            "--live-tls-key", str(tmp_path / "k.pem"), "--", sys.executable, "-c", "pass")
    assert r.code == 2 and "no such certificate" in r.err
    r = cli("serve", "--live-flush-s", "0.5", "-o", str(tmp_path / "s"))
    assert r.code == 2 and "--live-flush-s needs --live" in r.err
    r = cli("record", "-o", str(tmp_path / "r"), "--live", ":0", "--live-flush-s", "0", "--", sys.executable,
            "-c", "pass")
    assert r.code == 2 and "--live-flush-s" in r.err and "Traceback" not in r.err
    for cmd in ("serve", "record"):
        help_text = cli(cmd, "--help").out
        assert "--live HOST:PORT" in help_text and "--live-flush-s" in help_text


@pytest.mark.slow
def test_live_flush_interval_reaches_the_writer(cli, tmp_path: Path) -> None:
    """--live-flush-s sets how often the writer flushes while live, and the trace says so;
    without it the default (LIVE_FLUSH_S) is used."""
    from tracetool.live.config import LIVE_FLUSH_S

    for flag, want in (((), LIVE_FLUSH_S), (("--live-flush-s", "0.05"), 0.05)):
        out = tmp_path / f"r{want}"
        r = cli("record", "-o", str(out), "--live", "127.0.0.1:0", *flag, "--", sys.executable, "-c", "pass")
        assert r.code == 0, r.err
        assert open_trace(out).meta["live"]["flush_interval_s"] == want


@pytest.mark.slow
def test_record_live_streams_from_the_program(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "trace"
    env = dict(os.environ, PYTHONPATH=str(REPO), TRACETOOL_LIVE_TOKEN="tok")
    proc = subprocess.Popen([sys.executable, "-m", "tracetool", "record", "-o", str(out), "--live",
                             f"127.0.0.1:{port}", "--", sys.executable, str(WAIT_SCRIPT)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        from tracetool.live.client import ClientOptions

        conn, got = connect(parse_address(f"127.0.0.1:{port}"), ClientOptions(token="tok"))
        try:
            wait_until(lambda: conn.state == CONNECTED, "the program's live endpoint")
            hello = got.hellos[0][0]
            assert hello["meta"]["recorded_command"][-1] == str(WAIT_SCRIPT)
        finally:
            conn.stop()
        _, err = proc.communicate("\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert f"live: streaming this trace on 127.0.0.1:{port}" in err and "token required" in err
    meta = open_trace(out).meta
    assert meta["live"]["address"] == f"127.0.0.1:{port}" and meta["live"]["viewers_served"] == 1


@pytest.mark.slow
def test_recording_process_exits_promptly_with_a_stalled_viewer(tmp_path: Path) -> None:
    script = tmp_path / "host.py"
    script.write_text(
        "import sys\n"
        "from collectors.recorder import Recorder\n"
        "from tracetool.live.config import LiveConfig\n"
        "rec = Recorder(sys.argv[1], live=LiveConfig('127.0.0.1:0', viewer_buffer_rows=1000)).start()\n"
        "print(rec.live.address, flush=True)\n"
        "sys.stdin.readline()\n"
        "for b in range(20):\n"
        "    with rec.request(f'r{b}') as req:\n"
        "        for i in range(20000):\n"
        "            req.token(i)\n"
        "    rec.writer.flush()\n"
        "rec.close()\n")
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "t")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert proc.stdout is not None
        address = parse_address(proc.stdout.readline().strip())
        client = flight.FlightClient(address.uri(False))
        reader = client.do_get(flight.Ticket(ticket("tokens", "stalled", history=False)))
        reader.read_chunk()  # attached; it never reads again while 400k tokens are streamed
        t0 = time.monotonic()
        proc.communicate("go\n", timeout=60)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert elapsed < 20, f"the host took {elapsed:.1f} s to finish with a stalled viewer"
    assert open_trace(tmp_path / "t").rows("tokens") == 400_000
    reader.cancel()
    client.close()
