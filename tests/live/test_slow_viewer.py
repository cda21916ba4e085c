"""A viewer that stops reading never slows or blocks the recorder: its rows are dropped and counted."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pyarrow.flight as flight
import pytest
from live_helpers import connect, wait_until

from collectors.recorder import Recorder
from tracetool.live.client import ClientOptions, ServerConnection
from tracetool.live.config import LiveConfig
from tracetool.live.protocol import read_meta, ticket
from tracetool.reader import open_trace

TOKENS = 400_000


def _token_rate(rec: Recorder, prefix: str) -> float:
    """Tokens per second through the Recorder's hot path (the host's loop), flushed in 20 batches
    (a deterministic number of batches, whatever the machine's load does to the flusher)."""
    t0 = time.perf_counter()
    for b in range(20):
        for k in range(TOKENS // 20_000):
            with rec.request(f"{prefix}{b}-{k}") as req:
                for i in range(1000):
                    req.token(i, kv_len=i)
        rec.writer.flush()
    return TOKENS / (time.perf_counter() - t0)


@pytest.mark.slow
def test_stalled_viewer_does_not_block_the_recorder(live_recorder: Callable[..., Recorder]) -> None:
    rec = live_recorder(live=LiveConfig("127.0.0.1:0", viewer_buffer_rows=20_000))
    alone = _token_rate(rec, "alone")
    client = flight.FlightClient(rec.live.url)
    reader = client.do_get(flight.Ticket(ticket("tokens", "stalled", history=False)))
    reader.read_chunk()  # attached (a heartbeat or a batch), then it never reads again
    stalled = _token_rate(rec, "stalled")
    stats = rec.live.stats()
    assert stats["viewers"] == 1
    assert stats["dropped_rows_for_viewers"] > 0, "the stalled viewer's rows were dropped, not queued forever"
    assert rec.writer.dropped == {}, "the writer never waited: nothing dropped on the way to disk"
    # The hot path never touches the endpoint; a blocked flusher would show as writer drops (above).
    # The ratio is loose because two cores are shared; benchmarks/bench_live.py measures it properly.
    assert stalled > alone / 3, f"recorder slowed by a stalled viewer: {stalled:,.0f} vs {alone:,.0f} tok/s"
    endpoint = rec.live
    t0 = time.monotonic()
    rec.close()  # with the viewer still stalled: closing waits for it only close_timeout_s
    assert time.monotonic() - t0 < endpoint.config.close_timeout_s + 3
    assert open_trace(rec.path).rows("tokens") == 2 * TOKENS
    reader.cancel()
    client.close()


@pytest.mark.slow
def test_the_viewer_sees_its_drops(live_recorder: Callable[..., Recorder]) -> None:
    rec = live_recorder(live=LiveConfig("127.0.0.1:0", viewer_buffer_rows=10_000))
    gate = threading.Event()
    received: list[int] = []

    def slow(conn: ServerConnection, table: str, batch: object) -> None:
        received.append(getattr(batch, "num_rows", 0))
        gate.wait(20)  # the viewer's reading thread stops here until the test lets it go

    conn = ServerConnection(rec.live.address, lambda *a: None, slow,
                            ClientOptions(dead_after_s=60, backoff_s=0.1)).start()
    try:
        wait_until(lambda: conn.state == "connected", "the connection")
        _token_rate(rec, "burst")  # 400k tokens while the viewer is stuck on its first batch
        wait_until(lambda: received, "the first batch")
        assert rec.live.stats()["dropped_rows_for_viewers"] > 0
        gate.set()
        wait_until(lambda: conn.dropped.get("tokens", 0) > 0, "the drop count at the viewer")
        # the burst may still be reaching the endpoint process and dropping after the first count
        # the viewer saw; the running count rides on every batch and heartbeat, so they converge
        wait_until(lambda: conn.dropped["tokens"] == rec.live.stats(conn.viewer)["dropped_rows_for_you"]["tokens"],
                   "the viewer's drop count to reach the endpoint's")
        assert conn.dropped["tokens"] == rec.live.stats(conn.viewer)["dropped_rows_for_you"]["tokens"]
    finally:
        gate.set()
        conn.stop()


def test_source_status_shows_drops(live_recorder: Callable[..., Recorder]) -> None:
    from tracetool.live.source import LiveSource

    rec = live_recorder()
    src = LiveSource([rec.live.address]).start()
    try:
        wait_until(lambda: src.connections[0].state == "connected", "the connection")
        assert "rows dropped" not in src.status()
        src.connections[0]._dropped_before["tokens"] = 1234  # what an earlier session reported
        assert "1,234 rows dropped" in src.status()
    finally:
        src.close()


def test_heartbeats_carry_the_drop_count(live_recorder: Callable[..., Recorder]) -> None:
    rec = live_recorder()
    conn, got = connect(rec.live.address)
    try:
        got.wait(lambda g: bool(g.hellos), "hello")
        client = flight.FlightClient(rec.live.url)
        reader = client.do_get(flight.Ticket(ticket("gpu", "probe", history=False)))
        chunk = reader.read_chunk()  # nothing is written to gpu: the first message is a heartbeat
        assert read_meta(chunk.app_metadata) == {"hb": 1, "dropped": 0}
        assert chunk.data.num_rows == 0
        reader.cancel()
        client.close()
    finally:
        conn.stop()
