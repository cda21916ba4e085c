"""An oversized OTLP/HTTP body gets a 413 the client can read, and what the receiver reads of it is bounded.

Bodies of 4x the limit (16 MiB, far beyond what socket buffers hold; the default drain bound
reads up to 4x the limit after refusing), declared or chunked, protobuf or JSON, sent by httpx
(which writes the whole body before it reads, as urllib3 and the OTLP exporters do), by a raw client
that writes everything then reads, and by a client that asks ``Expect: 100-continue``: each reads
the 413 and its reason, never a reset. A client that declares a gigabyte and keeps sending is cut
off after the drain bound, and the receiver goes on.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.otlp.otlp_helpers import running_receiver
from tests.otlp.slow_clients import HEAD, SAFETY_S, connect, one_response, status_of
from tests.otlp.test_receiver_bad_input import _good

LIMIT = 4 << 20
BIG = 4 * LIMIT
PROTO = {"content-type": "application/x-protobuf"}
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with running_receiver(tmp_path_factory.mktemp("r413") / "t", max_body_bytes=LIMIT) as r:  # the default drain
        yield r


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
@pytest.mark.parametrize("headers", [PROTO, JSON], ids=["protobuf", "json"])
def test_httpx_reads_the_413_and_its_reason(receiver, chunked: bool, headers: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    body = b"\0" * BIG
    content = (body[i:i + (1 << 16)] for i in range(0, BIG, 1 << 16)) if chunked else body
    resp = httpx.post(f"http://{receiver.receiver.http_address}/v1/traces", content=content, headers=headers,
                      timeout=SAFETY_S)
    assert resp.status_code == 413
    reason = resp.json()["message"] if headers is JSON else resp.text
    assert "over the limit of 4,194,304" in reason, reason


def test_a_client_that_writes_everything_then_reads_gets_the_413(receiver) -> None:  # type: ignore[no-untyped-def]
    s = connect(receiver.receiver.http_address)
    try:
        s.sendall(HEAD.format(length=BIG, extra="").encode() + b"\0" * BIG)
        got = one_response(s)
    finally:
        s.close()
    assert status_of(got) == 413 and b"body of 16,777,216 bytes over the limit of 4,194,304" in got, got[:300]


def test_expect_100_continue_gets_the_413_before_sending_the_body(receiver) -> None:  # type: ignore[no-untyped-def]
    s = connect(receiver.receiver.http_address)
    try:
        s.sendall(HEAD.format(length=BIG, extra="Expect: 100-continue\r\n").encode())
        got = one_response(s)
    finally:
        s.close()
    assert status_of(got) == 413, got[:300]


def test_an_endless_upload_is_cut_off_and_the_receiver_goes_on(tmp_path: Path) -> None:
    drain = 4 * LIMIT  # the default
    with running_receiver(tmp_path / "t", max_body_bytes=LIMIT) as r:
        s = connect(r.receiver.http_address)
        sent = 0
        chunk = b"\0" * (1 << 20)
        try:
            s.sendall(HEAD.format(length=1 << 40, extra="").encode())  # a terabyte declared
            while sent < 1 << 32:
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:  # the receiver closed the connection: what a client of an endless upload sees
            pass
        finally:
            s.close()
        # what was sent: the drain bound, plus what the two sockets' buffers held when it closed
        assert sent < drain + (64 << 20), f"the receiver read {sent:,} bytes of an endless upload"
        stats = r.receiver.http_stats
        assert stats is not None and stats.drained_bytes <= drain + (1 << 16)
        url = f"http://{r.receiver.http_address}/v1/traces"
        assert httpx.post(url, content=_good("after"), headers=PROTO, timeout=SAFETY_S).status_code == 200
        assert any("over the limit" in ln and "(HTTP 413)" in ln for ln in r.lines())


def test_the_real_exporter_is_told_413(receiver, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    from tests.otlp.otlp_helpers import Spans

    sp = Spans("big")
    for i in range(4000):  # about 7 MB encoded: over the 4 MiB limit, within the drain bound
        sp.span(f"span-{i}", 0, 1, attributes={f"k{j}": "v" * 200 for j in range(8)})
    exporter = OTLPSpanExporter(endpoint=f"http://{receiver.receiver.http_address}/v1/traces", timeout=SAFETY_S)
    assert exporter.export(sp.finished()) is SpanExportResult.FAILURE
    assert any("413" in rec.getMessage() for rec in caplog.records), [r.getMessage() for r in caplog.records]
    assert not any("reset" in rec.getMessage().lower() for rec in caplog.records)
