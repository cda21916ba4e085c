"""``tracetool receive``: an OTLP trace receiver (gRPC and HTTP) that writes a v1 trace.

Both listeners run on one asyncio loop: OTLP/gRPC (``grpc.aio``, the
``TraceService/Export`` method) and OTLP/HTTP (uvicorn with a bare ASGI app:
``POST /v1/traces``, ``application/x-protobuf`` or ``application/json``,
optionally gzip). Each accepted payload goes to the
:class:`~tracetool.otlp.sink.OtlpSink` whole.

Bad input never stops the receiver and never touches what was received
before it: a malformed payload, an unknown attribute type, a wrong content
type or encoding, or a body over ``max_body_bytes`` gets a 4xx (HTTP 400,
413, 415; gRPC INVALID_ARGUMENT, RESOURCE_EXHAUSTED) and one line on stderr.
gRPC itself refuses messages over twice the limit before tracetool sees them
(RESOURCE_EXHAUSTED, no line): the margin lets tracetool say why for the rest.

SIGINT (Ctrl-C), SIGTERM or ``duration_s`` stop it: the listeners close,
spans still waiting for their request are placed, the trace is closed
(``"closed": true``) and the exit code is 0 — stopping is how a receiver ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
import zlib
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracetool.errors import UsageError
from tracetool.otlp.decode import BadPayload, OtelSpan, decode_json, decode_protobuf
from tracetool.otlp.sink import OtlpSink
from tracetool.untrusted import LINE_LIMIT, echo, shown

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
        self.grpc_address: str | None = None
        self.http_address: str | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

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

    # -- HTTP ------------------------------------------------------------------------------------------
    async def http_app(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        """OTLP/HTTP as a bare ASGI app."""
        if scope["type"] != "http":
            return
        client = scope.get("client")
        peer = _show(*client[:2]) if client else ""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        ctype = headers.get("content-type", "").split(";")[0].strip().lower()
        as_json = ctype == "application/json"

        async def answer(status: int, body: bytes, reason: str | None = None) -> None:
            if reason is not None:
                self._refuse(peer, reason, f"HTTP {status}")
                body = (json.dumps({"code": 3, "message": reason}) if as_json else reason).encode()
            kind = b"application/json" if as_json else (b"application/x-protobuf" if reason is None
                                                         else b"text/plain; charset=utf-8")
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        if scope.get("path") != TRACES_PATH:
            await answer(404, b"", f"no such path {scope.get('path')!r:.80} (OTLP traces go to {TRACES_PATH})")
            return
        if scope.get("method") != "POST":
            await answer(405, b"", f"method {scope.get('method')} (OTLP wants POST)")
            return
        if ctype not in ("application/json", "application/x-protobuf"):
            await answer(415, b"", f"content type {ctype or 'missing'!r:.80}: OTLP/HTTP sends "
                                   "application/x-protobuf or application/json")
            return
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity", "gzip"):
            await answer(415, b"", f"content encoding {encoding!r:.40}: gzip or none")
            return
        limit = self.cfg.max_body_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await answer(413, b"", f"body of {int(declared):,} bytes over the limit of {limit:,}")
            return
        body = bytearray()
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            if len(body) > limit:
                await answer(413, b"", f"body over the limit of {limit:,} bytes")
                return
            if not msg.get("more_body"):
                break
        data = bytes(body)
        if encoding == "gzip":
            try:
                data = _gunzip(data, limit)
            except BadPayload as e:
                status = 413 if "over the limit" in str(e) else 400
                await answer(status, b"", str(e))
                return
        try:
            spans = decode_json(data) if as_json else decode_protobuf(data)
        except BadPayload as e:
            await answer(400, b"", str(e))
            return
        try:
            self._take(spans)
        except Exception as e:  # a bug of ours: the sender learns, the receiver goes on
            await answer(500, b"", f"internal error ({type(e).__name__}: {e})")
            return
        await answer(200, b"{}" if as_json else b"")

    # -- gRPC ------------------------------------------------------------------------------------------
    def _grpc_handler(self) -> Any:
        import grpc

        async def export(data: bytes, context: Any) -> bytes:
            peer = (context.peer() or "").removeprefix("ipv4:").removeprefix("ipv6:")
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

        # raw bytes in (no deserializer): the size check and the decoding are tracetool's, so a bad
        # message gets the same one-line answer as over HTTP
        method = grpc.unary_unary_rpc_method_handler(export, request_deserializer=None,
                                                     response_serializer=None)
        return grpc.method_handlers_generic_handler(GRPC_SERVICE, {"Export": method})

    async def _start_grpc(self) -> Any:
        # gRPC core logs failed handshakes and binds straight to fd 2 unless told not to, before it
        # initialises (as tracetool.live.quiet_grpc does for Flight); a value the user set is kept
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
        import grpc

        assert self.cfg.grpc is not None
        host, port = parse_hostport(self.cfg.grpc, "--otlp-grpc")
        cap = 2 * self.cfg.max_body_bytes
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", cap),
                                          ("grpc.max_send_message_length", 1 << 20),
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
        http_server = http_task = None
        try:
            if self.cfg.grpc:
                grpc_server = await self._start_grpc()
            if self.cfg.http:
                http_server, sock = self._uvicorn()
                http_task = asyncio.ensure_future(http_server.serve(sockets=[sock]))
                while not http_server.started and not http_task.done():
                    await asyncio.sleep(0.01)
                if http_task.done():
                    http_task.result()
                    raise UsageError(f"OTLP/HTTP did not start on {self.cfg.http}")
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
            if http_server is not None and http_task is not None:
                http_server.should_exit = True
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(http_task, 10)
            if grpc_server is not None:
                with contextlib.suppress(Exception):
                    await grpc_server.stop(grace=2)

    def stop(self) -> None:
        """Ask :meth:`serve` to return (from any thread)."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def _uvicorn(self) -> tuple[Any, socket.socket]:
        import uvicorn

        from tracetool.serving.runner import bind

        assert self.cfg.http is not None
        host, port = parse_hostport(self.cfg.http, "--otlp-http")
        try:
            sock = bind(host, port)
        except UsageError:
            raise UsageError(f"cannot listen on {_show(host, port)} for OTLP/HTTP; pick another --otlp-http "
                             "(port 0 picks a free one)") from None
        self.http_address = _show(*sock.getsockname()[:2])

        class Server(uvicorn.Server):
            """uvicorn without its own signal handling: the receiver's loop handles SIGINT/SIGTERM."""

            @contextlib.contextmanager
            def capture_signals(self) -> Generator[None, None, None]:
                yield

        # h11_max_incomplete_event_size bounds the header block; the body limit is ours
        config = uvicorn.Config(self.http_app, log_level="critical", access_log=False, lifespan="off", interface="asgi3",
                                timeout_keep_alive=30, server_header=False, date_header=False)
        return Server(config), sock


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
    from tracetool.serving.runner import check_out
    from tracetool.writer import TraceWriter

    if not cfg.grpc and not cfg.http:
        raise UsageError("nothing to listen on: give --otlp-grpc or --otlp-http")
    check_out(cfg.out, cfg.force)
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
        writer.update_meta(receive={"grpc": receiver.grpc_address, "http": receiver.http_address,
                                    "max_body_bytes": cfg.max_body_bytes})
        writer.close()
        s = sink.stats
        echo(f"tracetool: receiver stopped; {s.spans:,} spans, {s.requests:,} requests, "
             f"{s.refused_payloads:,} payloads refused; trace {cfg.out} closed", err=True)
    return 0
