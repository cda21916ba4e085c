"""OTLP/HTTP's listener: a small HTTP/1.1 server (asyncio and h11) that bounds what a client holds.

uvicorn served OTLP/HTTP before; like most ASGI servers it never times out a request whose
headers or body stop arriving, so a client that sent headers and one byte held its connection
(and, on SIGTERM, the receiver's shutdown: 10 s with 1,000 of them) for ever, and nothing capped
how many it could open. This server does what Go's net/http does for the OpenTelemetry
Collector (``ReadTimeout``, ``IdleTimeout``, the lingering close after an early answer):

* **a deadline per request** (:attr:`HttpLimits.read_timeout_s`): its headers and body arrive
  within this of its first byte (for a new connection, of the connection): else 408, closed;
* **idle connections close** (:attr:`HttpLimits.keep_alive_s` between two requests);
* **a cap on connections** (:attr:`HttpLimits.max_connections`): beyond it, 503 and closed;
* **a readable 413**: a body over :attr:`HttpLimits.max_body_bytes`, declared or streamed, is
  answered at once, then the rest is read and discarded (up to :attr:`HttpLimits.drain_bytes`,
  within the deadline) before the connection closes, so a client that writes its whole body
  before it reads (httpx, urllib3, the OTLP exporters) reads the 413 and its reason instead of a
  reset; an ``Expect: 100-continue`` client gets it before sending the body;
* **shutdown in bounded time** (:meth:`HttpServer.close`): idle connections close at once,
  requests in flight get a grace period, then every connection is closed, whatever the clients do.

The server knows HTTP, not OTLP: a :class:`Handler` (the receiver) judges each request by its
headers, then by its body, and words the server's own refusals.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Protocol

import h11

#: The largest request line and header block accepted (h11 answers 431 beyond).
MAX_HEADER_BYTES = 64 << 10
#: Connections the kernel queues before they are accepted.
BACKLOG = 2048
_READ = 64 << 10


@dataclass(frozen=True)
class HttpLimits:
    """What one client may hold; see the module docstring."""

    max_body_bytes: int = 16 << 20
    read_timeout_s: float = 10.0
    keep_alive_s: float = 60.0
    max_connections: int = 128
    #: After a refusal, body bytes read and discarded before closing (None: 4 x max_body_bytes).
    drain_bytes: int | None = None
    #: On close, how long requests in flight may take to finish.
    shutdown_grace_s: float = 1.0

    @property
    def drain(self) -> int:
        return 4 * self.max_body_bytes if self.drain_bytes is None else self.drain_bytes


@dataclass(frozen=True)
class Request:
    """A request's head: method, path (query dropped), lower-case headers, and the client."""

    method: str
    path: str
    headers: dict[str, str]
    peer: str


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"


class Handler(Protocol):
    """What the server asks about each request."""

    def head(self, request: Request) -> Response | None:
        """An answer from the head alone (a refusal), or None to read the body."""

    def body(self, request: Request, body: bytes) -> Response:
        """The answer to a whole request."""

    def refused(self, request: Request | None, peer: str, status: int, reason: str) -> Response:
        """The server's own refusal (408, 413, 503, a malformed request) as the client will read it."""


@dataclass
class HttpStats:
    """Counts the server keeps, for tests and the receiver's summary."""

    open: int = 0  #: connections open now (over-cap ones not counted)
    in_request: int = 0  #: of those, receiving a request now
    timed_out: int = 0  #: requests that missed their deadline (408)
    over_cap: int = 0  #: connections refused at the cap (503)
    drained_bytes: int = 0  #: body bytes read and discarded after a refusal


@dataclass(eq=False)
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    peer: str
    task: asyncio.Task[None] | None = None
    in_request: bool = False


class _Timeout(Exception):
    """The request's deadline passed."""


class _Closed(Exception):
    """The client closed or broke the connection."""


@dataclass(eq=False)
class HttpServer:
    """``await start(sock)``, then :meth:`close`; :attr:`stats` and :meth:`wait_for` say what it holds."""

    handler: Handler
    limits: HttpLimits = field(default_factory=HttpLimits)
    stats: HttpStats = field(default_factory=HttpStats)

    def __post_init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()
        self._closing = False
        self._waiters: list[tuple[Callable[[HttpStats], bool], asyncio.Future[None]]] = []

    async def start(self, sock: socket.socket) -> None:
        # the backlog asyncio would set (100) drops the SYNs of a burst of connections: clients retry
        # a second later; the socket's own (2048, tracetool.serving.runner.bind) is kept
        self._server = await asyncio.start_server(self._accept, sock=sock, limit=_READ, backlog=BACKLOG)

    async def wait_for(self, predicate: Callable[[HttpStats], bool]) -> None:
        """Return once ``predicate(stats)`` holds (checked at every change of the counts)."""
        if predicate(self.stats):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((predicate, fut))
        try:
            await fut
        finally:
            self._waiters = [w for w in self._waiters if w[1] is not fut]

    async def close(self) -> None:
        """Stop listening; close idle connections now, the rest after the grace period.

        A connection is closed by aborting its socket (its task then sees the end of the stream
        and returns), not by cancelling its task: asyncio's stream server logs a cancelled
        connection task as an error."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for c in list(self._conns):
            if not c.in_request:
                c.writer.transport.abort()
        tasks = [c.task for c in self._conns if c.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.limits.shutdown_grace_s)
            for c in list(self._conns):
                c.writer.transport.abort()
            if late:
                await asyncio.wait(late, timeout=1.0)

    # -- one connection --------------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer)
        if self._closing:
            writer.transport.abort()
            return
        try:
            if len(self._conns) >= self.limits.max_connections:
                self.stats.over_cap += 1
                self._changed()
                reason = f"{len(self._conns):,} connections open, the most this receiver takes; retry later"
                await self._over_cap(reader, writer, self.handler.refused(None, peer, 503, reason))
                return
            conn = _Conn(reader, writer, peer, asyncio.current_task())
            self._conns.add(conn)
            self.stats.open += 1
            self._changed()
            try:
                await self._serve(conn)
            finally:
                self._conns.discard(conn)
                self.stats.open -= 1
                self._set_in_request(conn, False)
        except (_Closed, _Timeout, ConnectionError, asyncio.IncompleteReadError, h11.ProtocolError):
            pass  # a client that stopped reading or broke the protocol mid-answer: nothing more to say
        except asyncio.CancelledError:  # the loop is ending: the connection ends with it, quietly
            pass
        finally:
            _close(writer)

    async def _serve(self, conn: _Conn) -> None:
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        started: float | None = time.monotonic()  # the first request's deadline counts from the connection
        while not self._closing:
            first = None if started is None else started + self.limits.read_timeout_s
            try:
                request, deadline = await self._head(conn, h, first)
            except _Timeout:
                if conn.in_request:  # a request began and did not finish: 408; an idle connection just closes
                    await self._refuse_timeout(conn, h, None)
                return
            except h11.RemoteProtocolError as e:
                refusal = self.handler.refused(None, conn.peer, e.error_status_hint, f"malformed request ({e})")
                await self._write_raw(conn.writer, refusal)
                return
            if request is None:
                return
            if not await self._one(conn, h, request, deadline):
                return
            if h.our_state is h11.MUST_CLOSE or h.their_state is not h11.DONE:
                return
            h.start_next_cycle()
            self._set_in_request(conn, False)
            started = None

    async def _head(self, conn: _Conn, h: h11.Connection, deadline: float | None
                    ) -> tuple[Request | None, float]:
        """The next request's head; None when the client closed. ``deadline`` None: waiting on a
        kept-alive connection, whose deadline starts with the request's first byte."""
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                wait = self.limits.keep_alive_s if deadline is None else deadline - time.monotonic()
                data = await self._read(conn, wait)
                if not data:  # the client closed (or the server is stopping): nothing to answer
                    return None, time.monotonic()
                if deadline is None:
                    deadline = time.monotonic() + self.limits.read_timeout_s
                self._set_in_request(conn, True)
                h.receive_data(data)
                continue
            if isinstance(event, h11.Request) and deadline is not None:
                return _request(event, conn.peer), deadline
            return None, time.monotonic()  # the client closed

    async def _one(self, conn: _Conn, h: h11.Connection, request: Request, deadline: float) -> bool:
        """Answer one request; False when the connection must close."""
        limit = self.limits.max_body_bytes
        early = self.handler.head(request)
        declared = request.headers.get("content-length", "")
        if early is None and declared.isdigit() and int(declared) > limit:
            early = self.handler.refused(request, conn.peer, 413,
                                         f"body of {int(declared):,} bytes over the limit of {limit:,}")
        if early is not None:
            await self._answer_and_drain(conn, h, request, early, deadline)
            return False
        if h.they_are_waiting_for_100_continue:
            await self._send(conn, h, h11.InformationalResponse(status_code=100, headers=[]), deadline)
        body = bytearray()
        try:
            while True:
                event = h.next_event()
                if event is h11.NEED_DATA:
                    data = await self._read(conn, deadline - time.monotonic())
                    if not data:  # the client went away mid-body (or the server is stopping): no one to answer
                        return False
                    h.receive_data(data)
                elif isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > limit:
                        refusal = self.handler.refused(request, conn.peer, 413,
                                                       f"body over the limit of {limit:,} bytes")
                        await self._answer_and_drain(conn, h, request, refusal, deadline)
                        return False
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:  # ConnectionClosed before the body ended
                    return False
        except _Timeout:
            await self._refuse_timeout(conn, h, request, len(body))
            return False
        except h11.RemoteProtocolError as e:
            await self._answer_and_drain(conn, h, request, self.handler.refused(
                request, conn.peer, e.error_status_hint, f"malformed body ({e})"), deadline)
            return False
        await self._respond(conn, h, self.handler.body(request, bytes(body)), deadline, close=self._closing)
        return True

    # -- answers ---------------------------------------------------------------------------------
    async def _refuse_timeout(self, conn: _Conn, h: h11.Connection, request: Request | None, got: int = 0) -> None:
        self.stats.timed_out += 1
        self._changed()
        what = "request headers" if request is None else f"request body ({got:,} bytes received)"
        refusal = self.handler.refused(request, conn.peer, 408,
                                       f"{what} not received within {self.limits.read_timeout_s:g} s")
        if request is None:  # h11 answers only a request it has read: written by hand
            await self._write_raw(conn.writer, refusal)
            return
        with contextlib.suppress(h11.LocalProtocolError, _Timeout):
            await self._respond(conn, h, refusal, time.monotonic() + 1.0, close=True)

    async def _answer_and_drain(self, conn: _Conn, h: h11.Connection, request: Request | None,
                                response: Response, deadline: float | None) -> None:
        """Answer before the body is read, then read and discard the rest of it (bounded) so the
        client reads the answer, not a reset; then close."""
        end = deadline if deadline is not None else time.monotonic() + self.limits.read_timeout_s
        try:
            await self._respond(conn, h, response, end, close=True)
        except (h11.LocalProtocolError, _Timeout):
            return
        left = self.limits.drain
        while left > 0 and h.their_state is h11.SEND_BODY:
            try:
                event = h.next_event()
            except h11.RemoteProtocolError:
                break
            if event is h11.NEED_DATA:
                try:
                    data = await self._read(conn, end - time.monotonic())
                except _Timeout:
                    break
                left -= len(data)
                self.stats.drained_bytes += len(data)
                h.receive_data(data)
            elif not isinstance(event, h11.Data):
                break
        with contextlib.suppress(OSError, RuntimeError):
            if conn.writer.can_write_eof():
                conn.writer.write_eof()

    async def _respond(self, conn: _Conn, h: h11.Connection, response: Response, deadline: float,
                       close: bool) -> None:
        headers = [("content-type", response.content_type), ("content-length", str(len(response.body)))]
        if close:
            headers.append(("connection", "close"))
        await self._send(conn, h, h11.Response(status_code=response.status, headers=headers,
                                               reason=_phrase(response.status).encode()), deadline)
        await self._send(conn, h, h11.Data(data=response.body), deadline)
        await self._send(conn, h, h11.EndOfMessage(), deadline)

    async def _over_cap(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, response: Response) -> None:
        """503 at once (before the request: written by hand), then read what the client sends for
        at most a second, so it reads the answer rather than a reset; then close."""
        conn = _Conn(reader, writer, _peer(writer))
        try:
            await self._write_raw(writer, response)
            end = time.monotonic() + min(1.0, self.limits.read_timeout_s)
            left = MAX_HEADER_BYTES
            while left > 0 and not self._closing:
                data = await self._read(conn, end - time.monotonic())
                if not data:
                    break
                left -= len(data)
        except (_Timeout, _Closed, ConnectionError, OSError):
            pass
        finally:
            _close(writer)

    async def _write_raw(self, writer: asyncio.StreamWriter, response: Response) -> None:
        """A whole response and the end of what we send (for answers h11 cannot make: no request read)."""
        head = (f"HTTP/1.1 {response.status} {_phrase(response.status)}\r\n"
                f"content-type: {response.content_type}\r\ncontent-length: {len(response.body)}\r\n"
                "connection: close\r\n\r\n").encode("latin-1")
        with contextlib.suppress(OSError, RuntimeError, asyncio.TimeoutError):
            writer.write(head + response.body)
            if writer.can_write_eof():
                writer.write_eof()
            await asyncio.wait_for(writer.drain(), 1.0)

    async def _send(self, conn: _Conn, h: h11.Connection, event: h11.Event, deadline: float) -> None:
        data = h.send(event)
        if data:
            conn.writer.write(data)
            try:
                await asyncio.wait_for(conn.writer.drain(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise _Timeout from None

    async def _read(self, conn: _Conn, wait: float) -> bytes:
        """Some bytes within ``wait`` seconds (b"" when the client closed its side)."""
        if wait <= 0:
            raise _Timeout
        try:
            return await asyncio.wait_for(conn.reader.read(_READ), wait)
        except asyncio.TimeoutError:
            raise _Timeout from None
        except (ConnectionError, OSError):
            raise _Closed from None

    def _set_in_request(self, conn: _Conn, value: bool) -> None:
        if conn.in_request != value:
            conn.in_request = value
            self.stats.in_request += 1 if value else -1
            self._changed()

    def _changed(self) -> None:
        for predicate, fut in self._waiters:
            if not fut.done() and predicate(self.stats):
                fut.set_result(None)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def _request(event: h11.Request, peer: str) -> Request:
    target = event.target.decode("latin-1")
    headers: dict[str, str] = {}
    for name, value in event.headers:
        headers[name.decode("latin-1").lower()] = value.decode("latin-1")
    return Request(event.method.decode("latin-1"), target.split("?", 1)[0], headers, peer)


def _peer(writer: asyncio.StreamWriter) -> str:
    addr = writer.get_extra_info("peername")
    if not addr:
        return ""
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()


__all__ = ["MAX_HEADER_BYTES", "Handler", "HttpLimits", "HttpServer", "HttpStats", "Request", "Response"]
