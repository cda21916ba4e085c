"""A recorder streaming synthetic tokens, clients attached early and late, history bounds."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow.compute as pc
from live_helpers import connect, produce

from collectors.recorder import Recorder
from tracetool.live.client import CONNECTED, ClientOptions
from tracetool.live.config import LiveConfig
from tracetool.live.protocol import STREAMED, parse_address
from tracetool.reader import open_trace
from tracetool.schema import TABLES


def test_streamed_tables_are_the_recorded_v1_tables() -> None:
    # clock_offsets: written by merge; otlp_spans: by tracetool receive, which has no --live
    assert set(STREAMED) == set(TABLES) - {"clock_offsets", "otlp_spans"}


def test_attached_client_receives_every_token_as_written(live_recorder: Callable[..., Recorder]) -> None:
    rec = live_recorder()
    conn, got = connect(rec.live.address)
    try:
        got.wait(lambda g: bool(g.hellos), "hello")
        hello, new = got.hellos[0]
        assert new and hello["instance"] == rec.live.instance
        assert {"spans", "tokens"} <= set(hello["tables"])
        produce(rec, requests=5, tokens=40)
        got.wait(lambda g: g.rows("tokens") == 200 and g.rows("requests") == 5, "200 tokens, 5 requests")
        assert conn.state == CONNECTED
        rec.close()
        on_disk = open_trace(rec.path)
        streamed = got.table("tokens").sort_by([("request_id", "ascending"), ("index", "ascending")])
        written = on_disk.table("tokens").sort_by([("request_id", "ascending"), ("index", "ascending")])
        assert streamed.equals(written.select(streamed.schema.names))
        assert got.rows("spans") == on_disk.rows("spans") == 15
        assert on_disk.meta["live"]["viewers_served"] == 1
    finally:
        conn.stop()


def test_late_attacher_gets_the_recent_history_first(live_recorder: Callable[..., Recorder]) -> None:
    rec = live_recorder()
    produce(rec, requests=3, tokens=10, prefix="early")
    rec.writer.flush()
    late, got = connect(rec.live.address)
    fresh, got_fresh = connect(rec.live.address, ClientOptions(history=False))
    try:
        got.wait(lambda g: g.rows("tokens") == 30, "the 30 tokens written before attaching")
        got_fresh.wait(lambda g: bool(g.hellos), "hello without history")
        produce(rec, requests=1, tokens=10, prefix="late")
        got.wait(lambda g: g.rows("tokens") == 40, "history then live tokens")
        got_fresh.wait(lambda g: g.rows("tokens") == 10, "only the live tokens")
        ids = set(got_fresh.table("tokens").column("request_id").to_pylist())
        assert ids == {"late0"}
    finally:
        late.stop()
        fresh.stop()


def test_history_is_bounded_in_rows(live_recorder: Callable[..., Recorder]) -> None:
    rec = live_recorder(live=LiveConfig("127.0.0.1:0", history_rows=100))
    for k in range(10):  # ten flushes of 50 tokens: history keeps the newest batches, <= 100 rows
        produce(rec, requests=1, tokens=50, prefix=f"b{k}-")
        rec.writer.flush()
    stats = rec.live.stats()
    assert stats["tables"]["tokens"]["rows"] == 500
    assert stats["tables"]["tokens"]["history_rows"] == 100
    conn, got = connect(rec.live.address)
    try:
        got.wait(lambda g: g.rows("tokens") == 100, "the bounded history")
        assert set(pc.unique(got.table("tokens").column("request_id")).to_pylist()) == {"b8-0", "b9-0"}
    finally:
        conn.stop()


def test_off_unless_asked_and_binds_loopback(tmp_path) -> None:
    rec = Recorder(tmp_path / "plain").start()
    try:
        assert rec.live is None
        assert "live" not in rec.writer.meta
    finally:
        rec.close()
    rec = Recorder(tmp_path / "live", live=":0").start()
    try:
        assert rec.live is not None and rec.live.address.host == "127.0.0.1"
        assert rec.live.address.port > 0
    finally:
        rec.close()
    assert parse_address("9000") == parse_address("127.0.0.1:9000")
    assert str(parse_address("[::1]:9000")) == "[::1]:9000"


def test_a_stream_dropped_before_its_first_batch_gives_its_viewer_slot_back() -> None:
    """A viewer killed while its streams open: gRPC drops a stream it never pulled from. Found by
    the SIGKILL fault test, whose endpoint kept the dead viewer's slot for good."""
    import gc

    from live_helpers import wait_until

    from tracetool.live.protocol import ticket
    from tracetool.live.server import LiveEndpoint

    ep = LiveEndpoint(LiveConfig("127.0.0.1:0", max_viewers=1))
    stream = ep.open_stream(ticket("tokens", "v1"), "ipv4:127.0.0.1:1", None)  # type: ignore[arg-type]
    assert ep.stats()["viewers"] == 1
    del stream  # never iterated, as when the connection breaks first
    gc.collect()
    wait_until(lambda: ep.stats()["viewers"] == 0, "the slot to be given back")
    ep.open_stream(ticket("tokens", "v2"), "ipv4:127.0.0.1:2", None)  # type: ignore[arg-type]  # not "too many"



def test_meta_changes_after_start_reach_a_late_viewer(live_recorder: Callable[..., Recorder]) -> None:
    """The forwarder re-sends meta.json only when the writer's meta_version moves: a model named,
    a note added and a table first used after the endpoint started all reach a later hello."""
    import json

    import pyarrow.flight as flight
    from live_helpers import wait_until

    rec = live_recorder()
    rec.writer.update_meta(model={"name": "late-model"})
    rec.writer.note("a note added while live")
    produce(rec, requests=1, tokens=3)
    rec.writer.flush()

    def hello() -> dict:
        client = flight.FlightClient(rec.live.url)
        try:
            return json.loads(next(iter(client.do_action(flight.Action("hello", b"")))).body.to_pybytes())
        finally:
            client.close()

    def has_it() -> bool:
        h = hello()
        meta = h.get("meta") or {}
        return ((meta.get("model") or {}).get("name") == "late-model"
                and "a note added while live" in meta.get("notes", []) and "tokens" in h.get("tables", []))

    wait_until(has_it, "the new meta in the endpoint's hello", timeout=5)


def test_server_metrics_stream_to_viewers(live_recorder) -> None:
    """A recording process that scrapes an engine (serve/record --metrics-url) streams the
    samples like any other table: a live view gets the engine's state too."""
    from collectors.prometheus import attach_scraper
    from tests.serving.engine_metrics_server import EngineDouble

    rec = live_recorder()
    with EngineDouble("vllm") as engine:
        attach_scraper(rec, engine.url.removesuffix("/v1") + "/metrics", clock="server", interval_s=0.1)
        conn, got = connect(rec.live.address)
        try:
            got.wait(lambda g: g.rows("server_metrics") > 0, "server_metrics rows")
        finally:
            conn.stop()
    names = set(got.table("server_metrics").column("name").to_pylist())
    assert "vllm:num_requests_waiting" in names
