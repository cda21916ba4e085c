"""The delay proxy on a real socket, and merge on tiny inline traces with exact expected values."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import make_trace, spans_table
from tracetool.merge import merge_traces
from tracetool.reader import open_trace
from tracetool.serving.proxy import DelayProxy

MS = 1_000_000


def echo_server() -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def test_proxy_adds_the_round_trip_and_keeps_bytes() -> None:
    srv, port = echo_server()
    with DelayProxy(("127.0.0.1", port), rtt_ms=60) as proxy, \
            socket.create_connection(("127.0.0.1", proxy.port)) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for i in range(3):
            payload = f"ping {i} ".encode() * 1000
            t = time.perf_counter()
            c.sendall(payload)
            got = b""
            while len(got) < len(payload):
                got += c.recv(65536)
            rtts.append((time.perf_counter() - t) * 1000)
            assert got == payload
    srv.close()
    assert all(60 <= r < 60 * 1.5 for r in rtts), rtts


def test_proxy_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        DelayProxy(("127.0.0.1", 1), rtt_ms=-1)


def _client(tmp: Path) -> Path:
    # r1: client.request 0..100 ms, two chunks; r2: client only (the server trace missed it)
    spans = spans_table([("r1", "client.request", 0, 100 * MS, "client"),
                         ("r1", "server.request", 10 * MS, 90 * MS, "server"),  # estimate, to be replaced
                         ("r2", "client.request", 0, 50 * MS, "client"),
                         ("r2", "server.request", 5 * MS, 45 * MS, "server")])
    tokens = pa.table({"request_id": ["r1", "r1", "r2"], "index": pa.array([0, 1, 0], pa.int32()),
                       "emit_ns": [30 * MS, 60 * MS, 20 * MS], "client_recv_ns": [40 * MS, 70 * MS, 25 * MS]})
    requests = pa.table({"request_id": ["r1", "r2"], "status": ["error", "ok"], "error": ["cut", None]})
    meta = {"clocks": {"client": "probe clock"}}
    return make_trace(tmp / "client", {"spans": spans, "tokens": tokens, "requests": requests}, meta)


def _server(tmp: Path, tokens_r1: int) -> Path:
    # r1 on the server clock (1000 s later): received at +1000.004 s, answered in 90 ms
    base = 1000_000 * MS
    spans = spans_table([("r1", "server.request", base + 4 * MS, base + 94 * MS, "server"),
                         ("r1", "decode", base + 30 * MS, base + 60 * MS, "server"),
                         ("r3", "server.request", base, base + 1 * MS, "server")])
    emits = [base + 30 * MS, base + 45 * MS, base + 60 * MS][:tokens_r1]
    tokens = pa.table({"request_id": pa.array(["r1"] * tokens_r1, pa.string()),
                       "index": pa.array(range(tokens_r1), pa.int32()), "emit_ns": pa.array(emits, pa.int64())})
    requests = pa.table({"request_id": ["r1"], "prompt_tokens": pa.array([7], pa.int32()), "status": ["ok"]})
    return make_trace(tmp / "server", {"spans": spans, "tokens": tokens, "requests": requests},
                      {"model": {"name": "m"}})


def test_merge_joins_offsets_and_receipts(tmp_path: Path) -> None:
    rep = merge_traces(_client(tmp_path), _server(tmp_path, 2), tmp_path / "out")
    assert (rep.client_requests, rep.server_requests, rep.joined, rep.client_only, rep.server_only) == (2, 2, 1, 1, 1)
    t = open_trace(tmp_path / "out")
    base = 1000_000 * MS
    off = t.table("clock_offsets").to_pylist()
    # t1=0, t4=100ms (client); t2=base+4ms, t3=base+94ms (server): NTP offset and round-trip network
    assert off == [{"request_id": "r1", "offset_ns": ((base + 4 * MS) + (base + 94 * MS - 100 * MS)) // 2,
                    "network_ns": 10 * MS}]
    spans = {(s["request_id"], s["name"], s["clock"]): s for s in t.table("spans").to_pylist()}
    assert spans[("r1", "server.request", "server")]["start_ns"] == base + 4 * MS  # the server's, not the estimate
    assert sum(1 for k in spans if k[:2] == ("r1", "server.request")) == 1
    shifted = spans[("r2", "server.request", "server")]  # client-only: estimate moved onto the server clock
    assert shifted["start_ns"] == 5 * MS + off[0]["offset_ns"]
    recv = {(r["request_id"], r["index"]): r["client_recv_ns"] for r in t.table("tokens").to_pylist()}
    assert recv[("r1", 0)] == 40 * MS and recv[("r1", 1)] == 70 * MS  # same counts: by index
    reqs = {r["request_id"]: r for r in t.table("requests").to_pylist()}
    assert reqs["r1"]["prompt_tokens"] == 7 and reqs["r1"]["status"] == "error" and reqs["r1"]["error"] == "cut"
    assert t.meta["model"] == {"name": "m"} and t.meta["clocks"]["client"] == "probe clock"
    assert t.meta["merge"]["joined"] == 1


def test_merge_maps_held_tokens_by_time(tmp_path: Path) -> None:
    # three server tokens, two chunks: token 1's text came with chunk 2 (at 70 ms)
    merge_traces(_client(tmp_path), _server(tmp_path, 3), tmp_path / "out")
    t = open_trace(tmp_path / "out")
    recv = {r["index"]: r["client_recv_ns"] for r in t.table("tokens").to_pylist() if r["request_id"] == "r1"}
    assert recv == {0: 40 * MS, 1: 70 * MS, 2: 70 * MS}


def test_merge_cli_errors(tmp_path: Path, cli) -> None:
    server = _server(tmp_path, 2)
    r = cli("merge", server, server, "-o", tmp_path / "o")
    assert r.code == 3 and "not a client trace" in r.err
    r = cli("merge", tmp_path / "missing", server, "-o", tmp_path / "o2")
    assert r.code == 3 and r.err.count("\n") == 1
    r = cli("merge", _client(tmp_path), server, "-o", tmp_path / "o3", "--json")
    assert r.code == 0 and json.loads(r.out)["joined"] == 1


# Two requests of a real run (SmolLM2-135M under `tracetool serve`, `tracetool probe --prompt-file`
# on loopback) that stopped on EOS: the EOS token sends no text, so the client saw one chunk
# fewer than the server made tokens. Times in ns from each side's request start; the server's
# clock starts `lag` after the client's.
EOS_RUN = {
    "short": {"client": 552020339, "server": 549046883, "lag": 1456960,
              "emit": [188445831, 320418077, 434803889, 548079855],
              "recv": [191411423, 323098968, 436817936]},
    "long": {"client": 1300371988, "server": 1293856922, "lag": 4025939,
             "emit": [201717539, 336979014, 460711791, 578318617, 695437130, 810398521, 932003059,
                      1048229899, 1173927862, 1291006438],
             "recv": [207377187, 341460786, 465418048, 582943523, 699948643, 817351021, 937086959,
                      1053586214, 1185183849]},
}


def _eos_traces(tmp: Path) -> tuple[Path, Path]:
    base = 1000_000 * MS  # the server clock is unrelated to the client's
    c_spans, s_spans, c_tok, s_tok = [], [], [], []
    for i, (rid, r) in enumerate(EOS_RUN.items()):
        c0 = i * 10_000 * MS
        s0 = base + c0 + r["lag"]
        c_spans.append((rid, "client.request", c0, c0 + r["client"], "client"))
        s_spans.append((rid, "server.request", s0, s0 + r["server"], "server"))
        c_tok += [(rid, k, c0 + t) for k, t in enumerate(r["recv"])]
        s_tok += [(rid, k, s0 + t) for k, t in enumerate(r["emit"])]

    def tok(rows: list[tuple[str, int, int]], col: str) -> pa.Table:
        rid, idx, t = zip(*rows, strict=True)
        cols = {"request_id": list(rid), "index": pa.array(idx, pa.int32()), "emit_ns": list(t)}
        if col == "client_recv_ns":
            cols[col] = list(t)
        return pa.table(cols)

    client = make_trace(tmp / "client", {"spans": spans_table(c_spans), "tokens": tok(c_tok, "client_recv_ns")})
    server = make_trace(tmp / "server", {"spans": spans_table(s_spans), "tokens": tok(s_tok, "emit_ns")})
    return client, server


def test_merge_gives_eos_ended_requests_the_receipt_of_their_own_chunk(tmp_path: Path) -> None:
    """The estimate of when the server sent a chunk is off by the clock-offset error (here a few
    hundred us to 2 ms early), while a chunk goes out microseconds after its token: the first chunk
    sent after the token moved every token onto the next chunk, one ITL (~120 ms) late."""
    merge_traces(*_eos_traces(tmp_path), tmp_path / "out")
    t = open_trace(tmp_path / "out")
    got: dict[str, dict[int, int | None]] = {}
    for row in t.table("tokens").to_pylist():
        got.setdefault(row["request_id"], {})[row["index"]] = row["client_recv_ns"]
    for i, (rid, r) in enumerate(EOS_RUN.items()):
        c0 = i * 10_000 * MS
        expected = [c0 + x for x in r["recv"]] + [None]  # the EOS token: no chunk carried it
        assert [got[rid][k] for k in range(len(r["emit"]))] == expected, rid


def test_merge_takes_the_client_tokens_of_requests_the_server_made_none_for(tmp_path: Path) -> None:
    """A middleware-only server trace (no token rows): r1's chunks are the joined trace's tokens,
    placed on the server clock at their estimated send time (receipt + offset - network / 2)."""
    server = _server(tmp_path, 0)
    merge_traces(_client(tmp_path), server, tmp_path / "out")
    t = open_trace(tmp_path / "out")
    base = 1000_000 * MS
    offset = ((base + 4 * MS) + (base + 94 * MS - 100 * MS)) // 2
    rows = {(r["request_id"], r["index"]): (r["emit_ns"], r["client_recv_ns"]) for r in t.table("tokens").to_pylist()}
    assert rows[("r1", 0)] == (40 * MS + offset - 5 * MS, 40 * MS)
    assert rows[("r1", 1)] == (70 * MS + offset - 5 * MS, 70 * MS)
    assert rows[("r2", 0)] == (20 * MS + offset, 25 * MS)  # client-only: its own estimate, median shift
    assert len(rows) == 3
    assert any("client's content chunks" in n for n in t.meta["notes"])
