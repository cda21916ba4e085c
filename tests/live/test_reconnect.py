"""A server that goes away: the client shows it disconnected, reconnects with backoff, never duplicates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pytest
from live_helpers import connect, free_port, produce, wait_until

from collectors.recorder import Recorder
from tracetool.live.client import CONNECTED, DISCONNECTED, ClientOptions
from tracetool.live.protocol import STREAMED, parse_address
from tracetool.reader import open_trace
from tracetool.schema import TABLES

SCRIPT = Path(__file__).parent / "scripts" / "stream_tokens.py"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []

    def start(name: str, port: int, prefix: str) -> subprocess.Popen[str]:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        p = subprocess.Popen([sys.executable, str(SCRIPT), str(tmp_path / name), f"127.0.0.1:{port}", prefix],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        procs.append(p)
        assert p.stdout is not None
        line = p.stdout.readline()  # the script says when its endpoint listens
        assert line.startswith("ready "), f"the recording process did not start: {line!r}"
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def test_server_killed_and_restarted_client_reconnects(spawn: Callable[..., subprocess.Popen[str]]) -> None:
    port = free_port()
    first = spawn("first", port, "a")
    conn, got = connect(parse_address(f"127.0.0.1:{port}"), ClientOptions(backoff_s=0.2, backoff_max_s=1.0))
    try:
        got.wait(lambda g: g.rows("tokens") >= 100, "tokens from the first server")
        instance = conn.instance
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        wait_until(lambda: conn.state == DISCONNECTED, "the client to see the server gone")
        assert conn.status().startswith("disconnected")
        assert "retrying" in conn.status()
        spawn("second", port, "b")
        wait_until(lambda: conn.state == CONNECTED and conn.instance != instance, "the reconnection")
        assert conn.connects == 2 and got.hellos[-1][1], "a restarted server is a new instance"
        got.wait(lambda g: any(r.startswith("b") for r in
                               g.table("tokens").column("request_id").to_pylist()[-5:]),
                 "tokens from the restarted server")
    finally:
        conn.stop()


def test_a_broken_stream_resumes_without_duplicates(live_recorder: Callable[..., Recorder]) -> None:
    rec = live_recorder()
    conn, got = connect(rec.live.address)
    try:
        produce(rec, requests=2, tokens=10, prefix="x")
        got.wait(lambda g: g.rows("tokens") == 20, "the first 20 tokens")
        session = conn._session
        assert session is not None
        session.fail("test: connection cut")  # as if the network dropped every stream at once
        wait_until(lambda: conn.connects == 2 and conn.state == CONNECTED, "the resumed connection")
        produce(rec, requests=2, tokens=10, prefix="y")
        got.wait(lambda g: g.rows("tokens") == 40, "the next 20 tokens, once each")
        rec.close()
        keys = pc.binary_join_element_wise(got.table("tokens").column("request_id"),
                                           pc.cast(got.table("tokens").column("index"), "string"), "/")
        assert len(pc.unique(keys)) == 40 == open_trace(rec.path).rows("tokens")
    finally:
        conn.stop()


class _EndsOneByOne(flight.FlightServerBase):
    """A server shutting down: every table's stream ends, the tokens stream last, after its final batch."""

    def __init__(self) -> None:
        super().__init__("grpc+tcp://127.0.0.1:0")

    def do_action(self, context: Any, action: flight.Action) -> Any:
        hello = {"instance": "closing", "version": 1, "tables": list(STREAMED), "meta": {}}
        return [flight.Result(json.dumps(hello).encode())]

    def do_get(self, context: Any, ticket: flight.Ticket) -> Any:
        table = json.loads(ticket.ticket.decode())["table"]
        schema = TABLES[table].arrow_schema

        def final_batches() -> Iterator[tuple[pa.RecordBatch, bytes]]:
            if table == "tokens":
                time.sleep(0.5)  # still being written when the other streams have ended
                rows = pa.Table.from_pylist([{"request_id": "r", "index": 0, "emit_ns": 5}], schema=schema)
                yield rows.to_batches()[0], b'{"seq": 0, "dropped": 0}'

        return flight.GeneratorStream(schema, final_batches())


def test_streams_that_end_one_by_one_deliver_their_last_batches() -> None:
    """The first table's stream to end does not cancel the others: their final batches still arrive."""
    server = _EndsOneByOne()
    conn, got = connect(parse_address(f"127.0.0.1:{server.port}"),
                        ClientOptions(backoff_s=5.0, backoff_max_s=5.0))
    try:
        got.wait(lambda g: g.rows("tokens") == 1, "the tokens stream's last batch", deadline=10)
        wait_until(lambda: conn.state == DISCONNECTED, "the end of the session once every stream ended")
        assert conn.connects == 1 and "ended" in conn.reason
    finally:
        conn.stop()
        server.shutdown()
