"""Clients that never finish: the receiver times them out, caps them, and stops promptly anyway.

Slowloris clients (tests/otlp/slow_clients.py) send headers and one byte of a body, or half a
header block, or nothing, and wait. The tests synchronise on what the receiver exposes: its
answers (a client's blocking read returns when the server answers or closes) and its HTTP
listener's counts (``Receiver.wait_http``: open connections, connections mid-request), never on
sleeps. Socket timeouts are safety nets, far above every deadline.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.otlp.conftest import start_receiver
from tests.otlp.otlp_helpers import running_receiver
from tests.otlp.slow_clients import (
    SAFETY_S,
    answer,
    connect,
    slow_body,
    slow_headers,
    sockets,
    status_of,
)
from tests.waiting import wait_until
from tracetool.otlp.receiver import GRPC_SERVICE
from tracetool.reader import open_trace

PROTO = {"content-type": "application/x-protobuf"}


def test_a_body_that_stops_arriving_gets_408_at_its_deadline(tmp_path: Path) -> None:
    with running_receiver(tmp_path / "t", read_timeout_s=0.5) as r, sockets() as held:
        held.append(slow_body(r.receiver.http_address))
        t0 = time.monotonic()
        got = answer(held[0])
        took = time.monotonic() - t0
        assert status_of(got) == 408, got[:200]
        assert b"request body (1 bytes received) not received within 0.5 s" in got
        assert took < SAFETY_S / 2, "answered at the deadline, not when the test gave up"
        assert r.receiver.http_stats is not None and r.receiver.http_stats.timed_out == 1
        lines = r.lines()
    assert len(lines) == 1 and "(HTTP 408)" in lines[0], lines


def test_half_a_header_block_gets_408_and_silence_is_closed(tmp_path: Path) -> None:
    with running_receiver(tmp_path / "t", read_timeout_s=0.5) as r, sockets() as held:
        held.append(slow_headers(r.receiver.http_address))
        held.append(connect(r.receiver.http_address))  # connects and says nothing
        got = answer(held[0])
        assert status_of(got) == 408 and b"request headers not received within 0.5 s" in got, got[:200]
        assert answer(held[1]) == b"", "a connection that never began a request is closed without an answer"
        r.receiver.wait_http(lambda st: st.open == 0 and st.timed_out == 1, SAFETY_S)


def test_an_idle_kept_alive_connection_is_closed(tmp_path: Path) -> None:
    from tests.otlp.test_receiver_bad_input import _good

    with running_receiver(tmp_path / "t", keep_alive_s=0.5) as r, sockets() as held:
        s = connect(r.receiver.http_address)
        held.append(s)
        body = _good("kept")
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: r\r\nContent-Type: application/x-protobuf\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = answer(s)  # returns when the server closes the idle connection
        assert status_of(got) == 200 and got.count(b"HTTP/1.1") == 1, got[:300]
        r.receiver.wait_http(lambda st: st.open == 0, SAFETY_S)


def test_connections_beyond_the_cap_get_503_and_the_receiver_goes_on(tmp_path: Path) -> None:
    from tests.otlp.test_receiver_bad_input import _good

    with running_receiver(tmp_path / "t", max_connections=3, read_timeout_s=60) as r, sockets() as held:
        address = r.receiver.http_address
        held += [slow_body(address) for _ in range(3)]
        r.receiver.wait_http(lambda st: st.in_request == 3, SAFETY_S)
        extra = slow_body(address, length=10, sent=b"0123456789")
        held.append(extra)
        got = answer(extra)
        assert status_of(got) == 503 and b"3 connections open" in got, got[:300]
        held[0].close()
        r.receiver.wait_http(lambda st: st.open == 2, SAFETY_S)
        assert httpx.post(f"http://{address}/v1/traces", content=_good("after-cap"), headers=PROTO).status_code == 200
        assert r.receiver.http_stats is not None and r.receiver.http_stats.over_cap == 1
    assert "after-cap" in open_trace(tmp_path / "t").table("requests").column("request_id").to_pylist()


def test_stopping_takes_the_grace_period_whatever_a_thousand_slow_clients_do(tmp_path: Path) -> None:
    n = 1000
    with running_receiver(tmp_path / "t", max_connections=n + 10, read_timeout_s=120,
                          shutdown_grace_s=1.0) as r, sockets() as held:
        address = r.receiver.http_address
        for i in range(n):  # bodies that stop, headers that stop, and silent connections
            held.append(slow_body(address) if i % 3 == 0 else slow_headers(address) if i % 3 == 1 else connect(address))
        r.receiver.wait_http(lambda st: st.open == n and st.in_request == n - n // 3, SAFETY_S)
        grpc_idle = [connect(r.receiver.grpc_address or "") for _ in range(10)]
        held += grpc_idle
        t0 = time.monotonic()
        r.receiver.stop()
        r.thread.join(SAFETY_S)
        took = time.monotonic() - t0
        assert not r.thread.is_alive()
        assert took < 2.5, f"stopping took {took:.2f} s with {n} slow clients"
        for s in held[:n]:  # every client is let go: an answer or the end of the connection
            answer(s)
        assert r.lines() == [], "connections closed by the stop are not refusals"


def test_a_client_that_hangs_up_mid_body_is_not_a_refusal(tmp_path: Path) -> None:
    with running_receiver(tmp_path / "t") as r, sockets() as held:
        held.append(slow_body(r.receiver.http_address, length=100_000, sent=b"x" * 5000))
        r.receiver.wait_http(lambda st: st.in_request == 1, SAFETY_S)
        held[0].close()
        r.receiver.wait_http(lambda st: st.open == 0, SAFETY_S)
        assert r.lines() == []


def test_sigterm_stops_the_receive_command_promptly_with_slow_clients(tmp_path: Path, children: list) -> None:
    child = start_receiver(tmp_path / "t")
    children.append(child)
    address = child.match["http"]
    with sockets() as held:
        held += [slow_body(address) for _ in range(100)]  # under the default cap (128): all held
        barrier = connect(address)  # answered after the server took the connections before it
        held.append(barrier)
        barrier.sendall(b"GET /v1/traces HTTP/1.1\r\nHost: r\r\n\r\n")
        assert status_of(answer(barrier)) == 405
        t0 = time.monotonic()
        code = child.stop(signal.SIGTERM, timeout_s=SAFETY_S)
        took = time.monotonic() - t0
    assert code == 0 and took < 3.0, (code, took, child.text[-2000:])
    assert re.search(r"receiver stopped; .* trace .* closed", child.text)
    assert open_trace(tmp_path / "t", strict=True).meta["closed"] is True
    assert "Traceback" not in child.text


def test_the_cli_takes_the_limits(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "tracetool", "receive", "-o", str(tmp_path / "t"), "--otlp-grpc", "off",
                        "--otlp-http", "127.0.0.1:0", "--duration", "0.2", "--read-timeout", "2",
                        "--max-connections", "7"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    receive = open_trace(tmp_path / "t").meta["receive"]
    assert receive["read_timeout_s"] == 2 and receive["max_connections"] == 7


@contextmanager
def stalled_grpc_calls(address: str, n: int) -> Iterator[list[Any]]:
    """``n`` Export calls that send their headers and never their message (the request stream
    blocks until the block ends); yields their futures."""
    import grpc

    stall = threading.Event()

    def never() -> Iterator[bytes]:
        stall.wait()
        yield from ()

    channels = [grpc.insecure_channel(address) for _ in range(n)]
    try:
        yield [ch.stream_unary(f"/{GRPC_SERVICE}/Export", request_serializer=None,
                               response_deserializer=None).future(never()) for ch in channels]
    finally:
        stall.set()
        for ch in channels:
            ch.close()


def test_a_grpc_call_whose_message_never_comes_is_ended_at_the_read_timeout(tmp_path: Path) -> None:
    """Each stalled call held one of --max-connections' slots for good; at the deadline it gets
    DEADLINE_EXCEEDED and one line, and a good Export is then taken."""
    import grpc

    from tests.otlp.test_receiver_bad_input import _good

    with running_receiver(tmp_path / "t", max_connections=2, read_timeout_s=0.5) as r, \
            stalled_grpc_calls(r.receiver.grpc_address or "", 2) as stalled:
        wait_until(lambda: r.receiver.grpc_reading == 2, "the 2 calls waiting for their message")
        for call in stalled:  # returns when the server ends the call
            assert call.exception(timeout=SAFETY_S).code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert r.grpc_export(_good("after-stall")) == grpc.StatusCode.OK
        lines = r.lines()
    assert len(lines) == 2 and all("message not received within 0.5 s (gRPC DEADLINE_EXCEEDED)" in ln
                                   for ln in lines), lines
    assert "after-stall" in open_trace(tmp_path / "t").table("requests").column("request_id").to_pylist()


def test_stopping_takes_the_grace_period_whatever_stalled_grpc_calls_do(tmp_path: Path) -> None:
    with running_receiver(tmp_path / "t", read_timeout_s=120, shutdown_grace_s=1.0) as r, \
            stalled_grpc_calls(r.receiver.grpc_address or "", 20) as stalled:
        wait_until(lambda: r.receiver.grpc_reading == 20, "the 20 calls waiting for their message")
        t0 = time.monotonic()
        r.receiver.stop()
        r.thread.join(SAFETY_S)
        took = time.monotonic() - t0
        assert not r.thread.is_alive() and took < 2.5, f"stopping took {took:.2f} s with stalled gRPC calls"
        for call in stalled:
            assert call.exception(timeout=SAFETY_S) is not None
        assert r.lines() == [], "calls ended by the stop are not refusals"

