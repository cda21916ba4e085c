"""Spans made by the real OpenTelemetry SDK, encoded by its OTLP encoder, fed to tracetool's sink.

Every payload in the happy-path tests is what an OTLP exporter would send:
spans built with the SDK's tracer (explicit times, so expected durations are
exact) and encoded by ``opentelemetry-exporter-otlp-proto-common``'s
``encode_spans``, the function both OTLP exporters call.
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tracetool.otlp.decode import decode_protobuf
from tracetool.otlp.receiver import GRPC_SERVICE, ReceiveConfig, Receiver
from tracetool.otlp.sink import OtlpSink
from tracetool.reader import Trace, open_trace
from tracetool.writer import TraceWriter

T0 = 1_790_000_000_000_000_000  # a Unix-epoch ns origin
MS = 1_000_000


class Spans:
    """An SDK tracer whose finished spans are collected; :meth:`payload` encodes and clears them."""

    def __init__(self, service: str = "server") -> None:
        self.memory = InMemorySpanExporter()
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self.provider.add_span_processor(SimpleSpanProcessor(self.memory))
        self.tracer = self.provider.get_tracer("test")

    def span(self, name: str, start_ms: float, end_ms: float, *, parent: Any = None,
             kind: SpanKind = SpanKind.INTERNAL, attributes: dict[str, Any] | None = None,
             events: list[tuple[str, float, dict[str, Any]]] = ()) -> Any:  # type: ignore[assignment]
        ctx = otel_trace.set_span_in_context(parent) if parent is not None else None
        s = self.tracer.start_span(name, context=ctx, kind=kind, start_time=T0 + int(start_ms * MS),
                                   attributes=attributes or {})
        for ev, at_ms, attrs in events:
            s.add_event(ev, attrs, timestamp=T0 + int(at_ms * MS))
        s.end(end_time=T0 + int(end_ms * MS))
        return s

    @contextmanager
    def open_span(self, name: str, start_ms: float, end_ms: float, **kw: Any) -> Iterator[Any]:
        """A span whose children are made inside the block; it ends (and is exported) after them."""
        ctx = otel_trace.set_span_in_context(kw.pop("parent")) if kw.get("parent") is not None else None
        s = self.tracer.start_span(name, context=ctx, kind=kw.pop("kind", SpanKind.INTERNAL),
                                   start_time=T0 + int(start_ms * MS), attributes=kw.pop("attributes", {}))
        yield s
        s.end(end_time=T0 + int(end_ms * MS))

    def finished(self) -> list[ReadableSpan]:
        out = list(self.memory.get_finished_spans())
        self.memory.clear()
        return out

    def payload(self, spans: list[ReadableSpan] | None = None) -> bytes:
        """The OTLP protobuf body an exporter would send for ``spans`` (default: all finished)."""
        return encode_spans(self.finished() if spans is None else spans).SerializeToString()


def receive_payloads(out: Path, *payloads: bytes) -> Trace:
    """Feed payloads to a sink as ``tracetool receive`` does, close, and read the trace."""
    writer = TraceWriter(out).start()
    sink = OtlpSink(writer)
    for p in payloads:
        sink.accept(decode_protobuf(p))
    sink.close()
    writer.close()
    return open_trace(out, strict=True)


def durations(trace: Trace) -> dict[str, dict[str, int]]:
    """request id -> span name -> summed duration (ns)."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for s in trace.table("spans").to_pylist():
        out[s["request_id"]][s["name"]] += s["end_ns"] - s["start_ns"]
    return out


@dataclass
class Running:
    receiver: Receiver
    err: io.StringIO
    out: Path
    thread: threading.Thread

    @property
    def http_url(self) -> str:
        return f"http://{self.receiver.http_address}/v1/traces"

    def grpc_export(self, data: bytes, timeout_s: float = 10.0) -> Any:
        """Send raw bytes to TraceService/Export; returns the gRPC status code."""
        import grpc

        with grpc.insecure_channel(self.receiver.grpc_address or "") as ch:
            call = ch.unary_unary(f"/{GRPC_SERVICE}/Export", request_serializer=None, response_deserializer=None)
            try:
                call(data, timeout=timeout_s)
                return grpc.StatusCode.OK
            except grpc.RpcError as e:
                return e.code()

    def lines(self) -> list[str]:
        return [ln for ln in self.err.getvalue().splitlines() if ln.strip()]


@contextmanager
def running_receiver(out: Path, **cfg: Any) -> Iterator[Running]:
    """A real receiver (gRPC + HTTP listeners on free loopback ports) on a thread of this process;
    on exit it is stopped, the sink closed and the trace written."""
    writer = TraceWriter(out).start()
    sink = OtlpSink(writer)
    err = io.StringIO()
    receiver = Receiver(ReceiveConfig(out=out, grpc="127.0.0.1:0", http="127.0.0.1:0", **cfg), sink, err=err)
    ready = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(receiver.serve(lambda r: ready.set()))
        except BaseException as e:  # surfaced in the test thread
            failure.append(e)
            ready.set()

    t = threading.Thread(target=run, name="test-receiver", daemon=True)
    t.start()
    assert ready.wait(30), "receiver did not start"
    if failure:
        raise failure[0]
    try:
        yield Running(receiver, err, out, t)
    finally:
        receiver.stop()
        t.join(30)
        sink.close()
        writer.close()
    assert not failure, failure
