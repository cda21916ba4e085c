"""``tracetool receive``: an OTLP trace receiver (gRPC and HTTP) that writes a v1 trace.

Both listeners run on one asyncio loop: OTLP/gRPC (``grpc.aio``, the
``TraceService/Export`` method) and OTLP/HTTP (:mod:`tracetool.otlp.http_server`:
``POST /v1/traces``, ``application/x-protobuf`` or ``application/json``,
optionally gzip). Each accepted payload goes to the
:class:`~tracetool.otlp.sink.OtlpSink` whole.

The senders are servers tracetool does not control: over HTTP a request's headers and body
must arrive within ``read_timeout_s`` (408 otherwise), idle connections close, at most
``max_connections`` are open (503 beyond), and a body over the limit gets a 413 the client can
read; over gRPC a call's message must arrive within ``read_timeout_s`` too (DEADLINE_EXCEEDED
otherwise), connections with no call close after ``keep_alive_s``, and at most
``max_connections`` calls run at once (RESOURCE_EXHAUSTED beyond).

Bad input never stops the receiver and never touches what was received
before it: a malformed payload, an unknown attribute type, a wrong content
type or encoding, or a body over ``max_body_bytes`` gets a 4xx (HTTP 400,
413, 415; gRPC INVALID_ARGUMENT, RESOURCE_EXHAUSTED) and one line on stderr.
gRPC itself refuses messages over twice the limit before tracetool sees them
(RESOURCE_EXHAUSTED, no line): the margin lets tracetool say why for the rest.

SIGINT (Ctrl-C), SIGTERM or ``duration_s`` stop it: the listeners close (idle connections at
once, requests in flight after ``shutdown_grace_s``, whatever the clients do), spans still
waiting for their request are placed, the trace is closed (``"closed": true``) and the exit code
is 0 — stopping is how a receiver ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracetool.errors import UsageError
from tracetool.otlp.decode import BadPayload, OtelSpan, decode_json, decode_protobuf
from tracetool.otlp.http_server import HttpLimits, HttpServer, HttpStats, Request, Response
from tracetool.otlp.sink import OtlpSink
from tracetool.untrusted import LINE_LIMIT, clip, echo, shown

#: The OTLP/HTTP path of traces (OTLP specification).
TRACES_PATH = "/v1/traces"
GRPC_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
#: Lines about refused payloads printed before the rest are only counted.
MAX_REFUSAL_LINES = 50


@dataclass
class ReceiveConfig:
    """Options of ``tracetool receive`` (see its ``--help``)."""

    out: Path
    grpc: str | None = "127.0.0.1:4317"
    http: str | None = "127.0.0.1:4318"
    duration_s: float | None = None
    max_body_bytes: int = 16 << 20
    idle_s: float = 10.0
    force: bool = False
    #: A request's headers and body arrive within this of its first byte (HTTP 408 otherwise), and
    #: a gRPC call's message within this of the call's start (DEADLINE_EXCEEDED otherwise).
    read_timeout_s: float = 10.0
    #: HTTP connections open at once (503 beyond), and gRPC calls at once.
    max_connections: int = 128
    #: A kept-alive HTTP connection with no request, or a gRPC connection with no call, closes after this.
    keep_alive_s: float = 60.0
    #: On stop, how long requests in flight may take to finish.
    shutdown_grace_s: float = 1.0
    #: After a 413, body bytes read and discarded before closing (None: 4 x max_body_bytes).
    drain_bytes: int | None = None

    def http_limits(self) -> HttpLimits:
        return HttpLimits(max_body_bytes=self.max_body_bytes, read_timeout_s=self.read_timeout_s,
                          keep_alive_s=self.keep_alive_s, max_connections=self.max_connections,
                          shutdown_grace_s=self.shutdown_grace_s, drain_bytes=self.drain_bytes)


def parse_hostport(value: str, flag: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` (port 0 picks a free one)."""
    v = value.strip()
    host, sep, port = v.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"{flag} wants HOST:PORT, not {value!r}")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def _show(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Receiver:
    """The two listeners around one sink; :meth:`serve` runs until stopped."""

    def __init__(self, cfg: ReceiveConfig, sink: OtlpSink, *, err: Any = None) -> None:
        self.cfg = cfg
        self.sink = sink
        self.err = err or sys.stderr
        self.refusals = 0
        #: gRPC calls begun whose message has not arrived yet (each holds one of max_connections)
        self.grpc_reading = 0
        self.grpc_address: str | None = None
        self.http_address: str | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: HttpServer | None = None

    # -- intake, shared by both transports ----------------------------------------------------------
    def _take(self, spans: list[OtelSpan]) -> None:
        self.sink.accept(spans)

    def _refuse(self, peer: str, reason: str, status: str) -> None:
        self.sink.refused()
        self.refusals += 1
        if self.refusals <= MAX_REFUSAL_LINES:
            more = "; further refusals are only counted (meta.json)" if self.refusals == MAX_REFUSAL_LINES else ""
            self._say(f"refused a payload from {peer or 'unknown peer'}: {reason} ({status}){more}")

    def _say(self, line: str) -> None:
        try:
            print(shown(f"tracetool: receive: {line}", LINE_LIMIT), file=self.err, flush=True)
        except (OSError, ValueError):
            pass

    # -- HTTP (the handler of tracetool.otlp.http_server) -----------------------------------------------
    def head(self, request: Request) -> Response | None:
        """Refuse on the head alone: path, method, content type, encoding."""
        path, method = request.path, request.method
        if path != TRACES_PATH:
            return self.refused(request, request.peer, 404,
                                f"no such path {clip(path, 80)!r} (OTLP traces go to {TRACES_PATH})")
        if method != "POST":
            return self.refused(request, request.peer, 405, f"method {clip(method, 20)!r} (OTLP wants POST)")
        ctype = _content_type(request)
        if ctype not in ("application/json", "application/x-protobuf"):
            return self.refused(request, request.peer, 415, f"content type {clip(ctype or 'missing', 80)!r}: OTLP/HTTP "
                                "sends application/x-protobuf or application/json")
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity", "gzip"):
            return self.refused(request, request.peer, 415, f"content encoding {clip(encoding, 40)!r}: gzip or none")
        return None

    def body(self, request: Request, body: bytes) -> Response:
        """Decode a whole payload and take it, or refuse it."""
        as_json = _content_type(request) == "application/json"
        data = body
        if request.headers.get("content-encoding", "").strip().lower() == "gzip":
            try:
                data = _gunzip(data, self.cfg.max_body_bytes)
            except BadPayload as e:
                return self.refused(request, request.peer, 413 if "over the limit" in str(e) else 400, str(e))
        try:
            spans = decode_json(data) if as_json else decode_protobuf(data)
        except BadPayload as e:
            return self.refused(request, request.peer, 400, str(e))
        try:
            self._take(spans)
        except Exception as e:  # a bug of ours: the sender learns, the receiver goes on
            return self.refused(request, request.peer, 500, f"internal error ({type(e).__name__}: {e})")
        if as_json:
            return Response(200, b"{}", "application/json")
        return Response(200, b"", "application/x-protobuf")

    def refused(self, request: Request | None, peer: str, status: int, reason: str) -> Response:
        """Count and say a refusal; the answer in the request's own encoding (OTLP's Status in JSON)."""
        self._refuse(peer, reason, f"HTTP {status}")
        if request is not None and _content_type(request) == "application/json":
            return Response(status, json.dumps({"code": 3, "message": reason}).encode(), "application/json")
        return Response(status, reason.encode("utf-8", "replace"))

    @property
    def http_stats(self) -> HttpStats | None:
        """What the OTLP/HTTP listener holds now (None before it starts)."""
        return None if self._http is None else self._http.stats

    def wait_http(self, predicate: Callable[[HttpStats], bool], timeout_s: float) -> None:
        """Block (from another thread) until ``predicate(http_stats)`` holds; TimeoutError after ``timeout_s``."""
        assert self._loop is not None and self._http is not None
        asyncio.run_coroutine_threadsafe(self._http.wait_for(predicate), self._loop).result(timeout_s)

    # -- gRPC ------------------------------------------------------------------------------------------
    def _grpc_handler(self) -> Any:
        import grpc

        async def export(requests: Any, context: Any) -> bytes:
            peer = (context.peer() or "").removeprefix("ipv4:").removeprefix("ipv6:")
            data = await self._grpc_message(context, peer)
            if len(data) > self.cfg.max_body_bytes:
                reason = f"message of {len(data):,} bytes over the limit of {self.cfg.max_body_bytes:,}"
                self._refuse(peer, reason, "gRPC RESOURCE_EXHAUSTED")
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, reason)
            try:
                spans = decode_protobuf(data)
            except BadPayload as e:
                self._refuse(peer, str(e), "gRPC INVALID_ARGUMENT")
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            try:
                self._take(spans)
            except Exception as e:
                self._refuse(peer, f"internal error ({type(e).__name__}: {e})", "gRPC INTERNAL")
                await context.abort(grpc.StatusCode.INTERNAL, "internal error")
            return b""  # an empty ExportTraceServiceResponse: everything accepted

        # A request stream, though Export is unary: grpc.aio reads a unary request before calling
        # its handler, with no deadline of its own, so a call that sends its headers and never its
        # message would hold one of max_connections' slots for good. Streamed, the handler runs at
        # the headers and reads the one message itself, within read_timeout_s (as HTTP reads a
        # body). The wire format is the same: clients call it as the unary method it is.
        # Raw bytes in (no deserializer): the size check and the decoding are tracetool's, so a bad
        # message gets the same one-line answer as over HTTP.
        method = grpc.stream_unary_rpc_method_handler(export, request_deserializer=None,
                                                      response_serializer=None)
        return grpc.method_handlers_generic_handler(GRPC_SERVICE, {"Export": method})

    async def _grpc_message(self, context: Any, peer: str) -> bytes:
        """The call's one message, read within ``read_timeout_s`` of the call's start (aborts the
        call with DEADLINE_EXCEEDED, or INVALID_ARGUMENT when the stream ends with none)."""
        import grpc

        self.grpc_reading += 1
        try:
            data = await asyncio.wait_for(context.read(), self.cfg.read_timeout_s)
        except asyncio.TimeoutError:
            data = None
        finally:
            self.grpc_reading -= 1
        if data is None:
            reason = f"message not received within {self.cfg.read_timeout_s:g} s"
            self._refuse(peer, reason, "gRPC DEADLINE_EXCEEDED")
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, reason)
        if data is grpc.aio.EOF or not isinstance(data, bytes):
            if context.cancelled() or (self._stop is not None and self._stop.is_set()):
                # the client hung up, or the stop ended the call: not a refusal (as over HTTP)
                await context.abort(grpc.StatusCode.CANCELLED, "call ended before its message")
            self._refuse(peer, "the call ended without a message", "gRPC INVALID_ARGUMENT")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no ExportTraceServiceRequest")
        return data

    async def _start_grpc(self) -> Any:
        # gRPC core logs failed handshakes and binds straight to fd 2 unless told not to, before it
        # initialises (as tracetool.live.quiet_grpc does for Flight); a value the user set is kept
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
        import grpc

        assert self.cfg.grpc is not None
        host, port = parse_hostport(self.cfg.grpc, "--otlp-grpc")
        cap = 2 * self.cfg.max_body_bytes
        # a connection with no call in flight for keep_alive_s is sent GOAWAY and closed, as an idle
        # HTTP connection is; a call in flight is bounded by read_timeout_s (its message) and
        # shutdown_grace_s (stopping), a connection's count of calls by maximum_concurrent_rpcs
        server = grpc.aio.server(maximum_concurrent_rpcs=self.cfg.max_connections,
                                 options=[("grpc.max_receive_message_length", cap),
                                          ("grpc.max_send_message_length", 1 << 20),
                                          ("grpc.max_connection_idle_ms", round(self.cfg.keep_alive_s * 1000)),
                                          ("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((self._grpc_handler(),))
        try:
            bound = server.add_insecure_port(_show(host, port))
        except RuntimeError:
            bound = 0
        if not bound:
            raise UsageError(f"cannot listen on {_show(host, port)} for OTLP/gRPC; pick another --otlp-grpc "
                             "(port 0 picks a free one)")
        await server.start()
        self.grpc_address = _show(host, bound)
        return server

    # -- running ----------------------------------------------------------------------------------------
    async def serve(self, on_ready: Callable[[Receiver], None] | None = None) -> None:
        """Listen until :meth:`stop`, a signal, or the configured duration."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        grpc_server = None
        try:
            if self.cfg.grpc:
                grpc_server = await self._start_grpc()
            if self.cfg.http:
                await self._start_http()
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    self._loop.add_signal_handler(sig, self._stop.set)
            if on_ready is not None:
                on_ready(self)
            deadline = None if self.cfg.duration_s is None else time.monotonic() + self.cfg.duration_s
            while not self._stop.is_set():
                wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), wait)
                self.sink.tick()
                if deadline is not None and time.monotonic() >= deadline:
                    break
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    self._loop.remove_signal_handler(sig)
            # both listeners at once: stopping takes the grace period, whatever the clients do
            closing = []
            if self._http is not None:
                closing.append(self._http.close())
            if grpc_server is not None:
                closing.append(grpc_server.stop(grace=self.cfg.shutdown_grace_s))
            await asyncio.gather(*closing, return_exceptions=True)

    def stop(self) -> None:
        """Ask :meth:`serve` to return (from any thread)."""
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop has ended: stopped already
                self._loop.call_soon_threadsafe(self._stop.set)

    async def _start_http(self) -> None:
        from tracetool.serving.runner import bind

        assert self.cfg.http is not None
        host, port = parse_hostport(self.cfg.http, "--otlp-http")
        try:
            sock = bind(host, port)
        except UsageError:
            raise UsageError(f"cannot listen on {_show(host, port)} for OTLP/HTTP; pick another --otlp-http "
                             "(port 0 picks a free one)") from None
        self.http_address = _show(*sock.getsockname()[:2])
        self._http = HttpServer(self, self.cfg.http_limits())
        await self._http.start(sock)


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _gunzip(data: bytes, limit: int) -> bytes:
    """Inflate a gzip body, at most ``limit`` bytes out (a decompression bomb stops there)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as e:
        raise BadPayload(f"gzip body is corrupt ({e})") from None
    if len(out) > limit or d.unconsumed_tail:
        raise BadPayload(f"gzip body inflates over the limit of {limit:,} bytes")
    if not d.eof:
        raise BadPayload("gzip body is truncated")
    return out


def run_receiver(cfg: ReceiveConfig, *, on_ready: Callable[[Receiver], None] | None = None) -> int:
    """``tracetool receive``: returns the exit code (0); the trace is closed on the way out."""
    from tracetool import __version__
    from tracetool.writer import TraceWriter
    from tracetool.writer.output import prepare_output

    if not cfg.grpc and not cfg.http:
        raise UsageError("nothing to listen on: give --otlp-grpc or --otlp-http")
    prepare_output(cfg.out, cfg.force, create=False)
    meta = {"producer": {"name": "tracetool receive", "version": __version__},
            "clocks": {"server": "Unix epoch nanoseconds of the servers that sent the spans (their clocks)"}}
    writer = TraceWriter(cfg.out, meta=meta, flush_interval_s=0.5).start()
    sink = OtlpSink(writer, idle_s=cfg.idle_s)
    receiver = Receiver(cfg, sink)

    def ready(r: Receiver) -> None:
        where = []
        if r.grpc_address:
            where.append(f"grpc {r.grpc_address}")
        if r.http_address:
            where.append(f"http://{r.http_address}{TRACES_PATH}")
        echo(f"tracetool: receiving OTLP traces on {' and '.join(where)} (trace {cfg.out}); "
             "Ctrl-C stops and closes the trace", err=True)
        if on_ready is not None:
            on_ready(r)

    try:
        asyncio.run(receiver.serve(ready))
    finally:
        sink.close()
        stats = receiver.http_stats
        writer.update_meta(receive={"grpc": receiver.grpc_address, "http": receiver.http_address,
                                    "max_body_bytes": cfg.max_body_bytes, "read_timeout_s": cfg.read_timeout_s,
                                    "max_connections": cfg.max_connections,
                                    "timed_out": stats.timed_out if stats else 0,
                                    "over_connection_cap": stats.over_cap if stats else 0})
        writer.close()
        s = sink.stats
        echo(f"tracetool: receiver stopped; {s.spans:,} spans, {s.requests:,} requests, "
             f"{s.refused_payloads:,} payloads refused; trace {cfg.out} closed", err=True)
    return 0
