"""Fuzzing the live stream reader: a hostile Arrow Flight server against ``tracetool attach``.

The server speaks the transport (Flight) but says anything inside it: a
``hello`` whose body is mutated JSON (the server's meta.json, notes, drop
counts, tables), table streams whose batches have mutated schemas and types,
and ``app_metadata`` of random bytes or mutated JSON. Headless
``attach --record`` and the TUI's data source (``LiveSource.snapshot``) must
never raise: ``attach`` exits 0 with a valid trace or 3 with one line. Each
example costs a connection, so this campaign is smaller than the others.
"""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.fuzzlib import assert_clean, fuzz_settings, run_cli, tried
from tests.fuzz.mutators import JSON_VALUES, dumps, mutated_json
from tests.fuzz.test_fuzz_trace_files import fuzzed_table
from tests.waiting import wait_until
from tracetool.live.protocol import STREAMED

HELLO = {"instance": "abc", "version": 1, "tables": list(STREAMED), "history_s": 30, "history_rows": 1000,
         "viewer_buffer_rows": 100, "heartbeat_s": 1, "started_unix_ns": 1,
         "meta": {"format": "tracetool", "version": 1, "notes": ["server note"], "dropped_rows": {"tokens": 2},
                  "model": {"name": "m", "layers": 2}, "producer": {"name": "tracetool serve"}}}


class Hostile(flight.FlightServerBase):
    """Answers ``hello`` and each table's ``DoGet`` with whatever the current script says."""

    def __init__(self) -> None:
        super().__init__("grpc+tcp://127.0.0.1:0")
        self.hello = b"{}"
        self.streams: dict[str, tuple[pa.Schema, list[tuple[pa.RecordBatch, bytes | None]]]] = {}
        self.lock = threading.Lock()

    def do_action(self, context: Any, action: flight.Action) -> Any:
        return [flight.Result(self.hello)]

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [("hello", ""), ("stats", "")]

    def do_get(self, context: Any, ticket: flight.Ticket) -> Any:
        try:
            table = json.loads(ticket.ticket.decode())["table"]
        except (ValueError, KeyError, TypeError):
            table = "?"
        with self.lock:
            schema, batches = self.streams.get(table, (pa.schema([]), []))
        return flight.GeneratorStream(schema, iter(batches))


_SERVER: list[Hostile] = []


def _server() -> Hostile:
    if not _SERVER:
        _SERVER.append(Hostile())
    return _SERVER[0]


@st.composite
def script(draw: Any) -> tuple[bytes, dict[str, tuple[pa.Schema, list[tuple[pa.RecordBatch, bytes | None]]]]]:
    hello: Any = draw(mutated_json(HELLO, max_ops=4)) if draw(st.integers(0, 5)) else draw(JSON_VALUES)
    if isinstance(hello, dict) and isinstance(hello.get("meta"), dict) and draw(st.booleans()):
        # the fields a viewer copies and adds up: the server's notes, drop counts, model and hardware
        key = draw(st.sampled_from(["notes", "dropped_rows", "model", "hardware", "closed", "format"]))
        hello["meta"][key] = draw(st.one_of(JSON_VALUES, st.dictionaries(st.sampled_from(["tokens", "layers"]),
                                                                           JSON_VALUES, max_size=2)))
    body = dumps(hello).encode() if draw(st.integers(0, 9)) else draw(st.binary(max_size=30))
    streams = {}
    for _ in range(draw(st.integers(0, 3))):
        name, table = draw(fuzzed_table())
        if name not in STREAMED:
            continue
        metas = []
        for seq in range(draw(st.integers(1, 3))):
            kind = draw(st.sampled_from(["ok", "ok", "json", "bytes", "none"]))
            if kind == "ok":
                metas.append(json.dumps({"seq": seq, "dropped": draw(st.integers(0, 5))}).encode())
            elif kind == "json":
                metas.append(dumps(draw(mutated_json({"seq": seq, "dropped": 0}))).encode())
            elif kind == "bytes":
                metas.append(draw(st.binary(max_size=20)))
            else:
                metas.append(None)
        batches = [(b, metas[i % len(metas)]) for i, b in enumerate(table.to_batches() or [])]
        streams[name] = (table.schema, batches)
    return body, streams


@fuzz_settings(0.15, floor=8)
@given(script())
def test_attach_record_against_a_hostile_server(case: tuple[bytes, dict[str, Any]]) -> None:
    srv = _server()
    body, streams = case
    with srv.lock:
        srv.hello, srv.streams = body, streams
    with tempfile.TemporaryDirectory(prefix="tracetool-fuzz-") as tmp:
        out = Path(tmp) / "t"
        r = run_cli("attach", f"127.0.0.1:{srv.port}", "--record", out, "--duration", "0.4",
                    "--connect-timeout", "2")
        assert_clean(r)
        if r.code == 0:
            assert_clean(run_cli("validate", out), allowed=(0,))
    tried("live stream (attach --record)")


@fuzz_settings(0.1, floor=6)
@given(script())
def test_live_source_snapshot_against_a_hostile_server(case: tuple[bytes, dict[str, Any]]) -> None:
    from tracetool.live.source import LiveSource

    srv = _server()
    body, streams = case
    with srv.lock:
        srv.hello, srv.streams = body, streams
    source = LiveSource([f"127.0.0.1:{srv.port}"]).start()
    try:
        # The script's streams are finite: a connection's first outcome comes when each has ended (or
        # the hello failed), and by then every batch the server sent has reached the source's windows.
        wait_until(lambda: all(c.first_outcome.is_set() for c in source.connections),
                   "the first connection to the hostile server to end")
        traces = source.snapshot()  # what the TUI's analysis worker reads
        for t in traces:
            for name in t.tables:
                t.table(name).validate(full=True)
        source.status()
    finally:
        source.close()
    tried("live stream (viewer source)")


def test_rows_that_break_the_row_rules_are_dropped_and_counted_not_saved() -> None:
    """Found by the random campaign: a server streaming a span with null required columns made
    ``attach --record`` save an invalid trace. Each row rule in turn, beside good rows."""
    from tracetool.reader import open_trace
    from tracetool.schema import TABLES

    def batch(table: str, rows: list[dict[str, Any]]) -> tuple[pa.Schema, list[tuple[pa.RecordBatch, bytes]]]:
        schema = TABLES[table].arrow_schema
        schema = pa.schema([f.with_nullable(True) for f in schema])
        t = pa.Table.from_pylist(rows, schema=schema)
        return schema, [(b, b'{"seq": 0, "dropped": 0}') for b in t.to_batches()]

    good_span = {"request_id": "r", "name": "decode", "start_ns": 1, "end_ns": 2, "clock": "server"}
    spans = [good_span, {**good_span, "request_id": None}, {**good_span, "end_ns": 0},
             {**good_span, "clock": "mars"}, {**good_span, "name": None, "start_ns": None}]
    good_token = {"request_id": "r", "index": 0, "emit_ns": 5}
    tokens = [good_token, {**good_token, "index": -1}, {**good_token, "emit_ns": None}]
    srv = _server()
    with srv.lock:
        meta = {k: v for k, v in HELLO["meta"].items() if k != "dropped_rows"}  # count only ours
        srv.hello = json.dumps({**HELLO, "instance": "rules", "meta": meta}).encode()
        srv.streams = {"spans": batch("spans", spans), "tokens": batch("tokens", tokens)}
    try:
        with tempfile.TemporaryDirectory(prefix="tracetool-fuzz-") as tmp:
            out = Path(tmp) / "t"
            r = run_cli("attach", f"127.0.0.1:{srv.port}", "--record", out, "--duration", "2",
                        "--connect-timeout", "5")
            assert_clean(r, allowed=(0,))
            assert_clean(run_cli("validate", out), allowed=(0,))
            t = open_trace(out, strict=True)
            assert t.rows("spans") == 1 and t.rows("tokens") == 1
            assert t.meta["dropped_rows"].get("spans") == 4 and t.meta["dropped_rows"].get("tokens") == 2
            assert any("break the v1 row rules" in n for n in t.meta["notes"])
    finally:
        with srv.lock:
            srv.hello, srv.streams = b"{}", {}
