"""The live endpoint: a trace's record batches served over Arrow Flight as they are written.

:class:`LiveEndpoint` runs in the endpoint process (:mod:`tracetool.live.sidecar`),
which the recording process feeds every batch its writer writes. Each batch
goes to :meth:`LiveEndpoint.on_batch`, which only appends references to
bounded queues under a short lock:

* **history** per table: the batches of the last ``history_s`` seconds, at
  most ``history_rows`` rows (oldest out first). A viewer that attaches late
  gets it first, then the live batches.
* **per-viewer queues**: at most ``viewer_buffer_rows`` rows per table and
  viewer. A viewer that reads slower than the trace grows (or stops reading,
  or vanished without closing) loses the batches that do not fit; the rows
  are counted, sent with every later message (``dropped``) and shown by the
  ``stats`` action.
* **access**: binds 127.0.0.1 unless told otherwise; when a token is set
  (``LiveConfig.token`` or ``$TRACETOOL_LIVE_TOKEN``) every call must carry
  ``authorization: Bearer <token>``, and a refusal is one line on stderr
  (at most one per client host every 10 s) and counted; TLS when a
  certificate and key are given.

:meth:`LiveEndpoint.close` ends every stream and gives gRPC
``close_timeout_s`` to finish. A viewer whose transport is full (it stopped
reading) keeps gRPC's write blocked, and gRPC's shutdown then waits for it
forever: that is why the server lives in its own process, which exits
regardless (see :mod:`tracetool.live.sidecar`).
"""

from __future__ import annotations

import hmac
import json
import socket
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from tracetool import __version__
from tracetool.errors import UsageError, one_line
from tracetool.live import quiet_grpc  # noqa: F401  (before any gRPC channel or server: no INFO lines on stderr)
from tracetool.live.config import LiveConfig
from tracetool.live.protocol import (
    AUTH_HEADER,
    HEARTBEAT_S,
    TOKEN_ENV,
    Address,
    batch_meta,
    heartbeat_meta,
    parse_address,
    read_ticket,
)
from tracetool.schema import TABLES
from tracetool.untrusted import echo


@dataclass(eq=False)
class _Viewer:
    """One stream of one table to one viewer."""

    viewer: str
    peer: str
    table: str
    cond: threading.Condition
    queue: deque[tuple[int, pa.RecordBatch]] = field(default_factory=deque)
    queued_rows: int = 0
    dropped_rows: int = 0
    dropped_batches: int = 0
    sent_rows: int = 0
    forgotten: bool = False


@dataclass
class _Table:
    history: deque[tuple[int, float, pa.RecordBatch]] = field(default_factory=deque)
    history_rows: int = 0
    seq: int = 0
    rows: int = 0
    viewers: list[_Viewer] = field(default_factory=list)


class LiveEndpoint:
    """A Flight server streaming a trace's tables as they are written.

    Args:
        config: bind address, token, TLS, limits.
        meta: returns the trace's current ``meta.json`` body (``hello`` sends it).
        tables: returns the tables the trace records.
        writer_dropped: returns the writer's own dropped rows per table.
    """

    def __init__(self, config: LiveConfig, *, meta: Callable[[], Mapping[str, Any]] = dict,
                 tables: Callable[[], list[str]] = list,
                 writer_dropped: Callable[[], Mapping[str, int]] = dict) -> None:
        self.config = config
        self.instance = uuid.uuid4().hex
        self._meta = meta
        self._declared = tables
        self._writer_dropped = writer_dropped
        self._lock = threading.Lock()
        self._tables: dict[str, _Table] = {name: _Table() for name in TABLES}
        self._viewer_ids: dict[str, int] = {}
        self._token = config.resolved_token()
        self._stopped = False
        self._started_ns = time.time_ns()
        self.tls = config.tls_cert is not None
        self.refused = 0
        self.viewers_served = 0
        self._said_refusal: dict[str, float] = {}
        self._service: _Service | None = None
        self.address: Address = parse_address(config.address)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> LiveEndpoint:
        """Bind and serve (gRPC's own threads). Raises :class:`UsageError` when it cannot."""
        addr = self.config.check()
        certs = []
        if self.config.tls_cert is not None and self.config.tls_key is not None:
            try:
                certs = [flight.CertKeyPair(Path(self.config.tls_cert).read_bytes(),
                                            Path(self.config.tls_key).read_bytes())]
            except OSError as e:
                raise UsageError(f"cannot read the live TLS certificate or key ({e.strerror or e})") from e
        _check_bind(addr)
        try:
            self._service = _Service(self, addr.uri(self.tls), certs)
        except (flight.FlightError, pa.ArrowException, OSError) as e:
            raise UsageError(f"--live: cannot listen on {addr} ({_line(e)}); pick another port "
                             "(0 picks a free one)") from e
        self.address = Address(addr.host, self._service.port)
        return self

    def close(self) -> None:
        """End every stream and stop the server; waits at most ``close_timeout_s``. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            for t in self._tables.values():
                for v in t.viewers:
                    v.cond.notify_all()
        service, self._service = self._service, None
        if service is None:
            return
        # shutdown() waits for running calls; a viewer stuck in a blocked write must not hold the
        # host's exit, so it runs in a daemon thread we wait for only so long.
        stopper = threading.Thread(target=_quiet(service.shutdown), name="tracetool-live-stop", daemon=True)
        stopper.start()
        stopper.join(self.config.close_timeout_s)

    @property
    def url(self) -> str:
        return self.address.uri(self.tls)

    # -- the writer's tap --------------------------------------------------------------------
    def on_batch(self, table: str, batch: pa.RecordBatch) -> None:
        """A batch was written to ``table``: keep it in the history and queue it for every viewer.

        Called on the writer's flushing thread; never blocks beyond a short lock.
        """
        n = batch.num_rows
        now = time.monotonic()
        cap = self.config.viewer_buffer_rows
        with self._lock:
            if self._stopped:
                return
            t = self._tables.get(table)
            if t is None:
                t = self._tables[table] = _Table()
            t.seq += 1
            t.rows += n
            t.history.append((t.seq, now, batch))
            t.history_rows += n
            self._trim(t, now)
            for v in t.viewers:
                if v.queue and v.queued_rows + n > cap:  # an empty queue takes any batch: no starving
                    v.dropped_rows += n
                    v.dropped_batches += 1
                    continue
                v.queue.append((t.seq, batch))
                v.queued_rows += n
                v.cond.notify()

    def _trim(self, t: _Table, now: float) -> None:
        oldest = now - self.config.history_s
        h = t.history
        while h and (t.history_rows > self.config.history_rows or h[0][1] < oldest):
            t.history_rows -= h.popleft()[2].num_rows

    # -- what the Flight service calls ---------------------------------------------------------
    def check_token(self, context: flight.ServerCallContext) -> None:
        """Refuse a call without the right token: one line on stderr, counted, a clear error back."""
        if self._token is None:
            return
        presented = context.get_middleware("token")
        value = presented.value if isinstance(presented, _Presented) else None
        expected = f"Bearer {self._token}"
        if value is not None and hmac.compare_digest(value.encode(), expected.encode()):
            return
        reason = "no token" if value is None else "wrong token"
        self._refuse(context.peer(), reason)
        raise flight.FlightUnauthenticatedError(
            f"tracetool live: {reason}: this server requires its shared token "
            f"(attach --token, or ${TOKEN_ENV})")

    def _refuse(self, peer: str, reason: str) -> None:
        with self._lock:
            self.refused += 1
            count = self.refused
            host = peer.rsplit(":", 1)[0]
            now = time.monotonic()
            quiet = now - self._said_refusal.get(host, -1e9) < 10.0
            if not quiet:
                self._said_refusal[host] = now
        if not quiet:
            try:
                echo(f"tracetool: live: refused a viewer from {peer}: {reason} ({count} refused so far)", err=True)
            except Exception:
                pass

    def hello(self) -> dict[str, Any]:
        meta = dict(self._meta())
        return {"instance": self.instance, "meta": meta, "tables": sorted(set(self._declared())),
                "history_s": self.config.history_s, "history_rows": self.config.history_rows,
                "viewer_buffer_rows": self.config.viewer_buffer_rows, "heartbeat_s": HEARTBEAT_S,
                "started_unix_ns": self._started_ns, "version": __version__}

    def stats(self, viewer: str | None = None) -> dict[str, Any]:
        """Rows streamed per table, viewers, drops and refusals (the ``stats`` action)."""
        with self._lock:
            tables = {name: {"batches": t.seq, "rows": t.rows, "history_rows": t.history_rows,
                             "sent_rows": sum(v.sent_rows for v in t.viewers)}
                      for name, t in self._tables.items()}
            streams = [v for t in self._tables.values() for v in t.viewers]
            mine = {v.table: v.dropped_rows for v in streams if v.viewer == viewer}
            doc = {"instance": self.instance, "address": str(self.address), "tls": self.tls,
                   "token_required": self._token is not None,
                   "uptime_s": (time.time_ns() - self._started_ns) / 1e9, "tables": tables,
                   "viewers": len(self._viewer_ids), "viewers_served": self.viewers_served,
                   "refused": self.refused,
                   "dropped_rows_for_viewers": sum(v.dropped_rows for v in streams),
                   "writer_dropped_rows": dict(self._writer_dropped())}
        if viewer is not None:
            doc["dropped_rows_for_you"] = mine
        return doc

    def open_stream(self, raw_ticket: bytes, peer: str,
                    context: flight.ServerCallContext) -> flight.GeneratorStream:
        try:
            tk = read_ticket(raw_ticket)
        except (ValueError, UnicodeDecodeError) as e:
            raise flight.FlightServerError(f"tracetool live: bad ticket ({e})") from e
        table, viewer_id = tk["table"], tk["viewer"]
        after = int(tk.get("after", -1)) if tk.get("instance") == self.instance else -1
        with self._lock:
            if self._stopped:
                raise flight.FlightUnavailableError("tracetool live: the server is stopping")
            if viewer_id not in self._viewer_ids and len(self._viewer_ids) >= self.config.max_viewers:
                raise flight.FlightUnavailableError(
                    f"tracetool live: too many viewers ({self.config.max_viewers} at most)")
            if viewer_id not in self._viewer_ids:
                self.viewers_served += 1
            self._viewer_ids[viewer_id] = self._viewer_ids.get(viewer_id, 0) + 1
            t = self._tables[table]
            self._trim(t, time.monotonic())
            backlog = [(s, b) for s, _, b in t.history if s > after] if tk.get("history", True) else []
            v = _Viewer(viewer_id, peer, table, threading.Condition(self._lock))
            t.viewers.append(v)
        schema = TABLES[table].arrow_schema
        stream = self._stream(v, backlog, context, _empty(schema))
        # A viewer gone before gRPC pulls the first batch leaves the generator unstarted, and an
        # unstarted generator's ``finally`` never runs: without this its slot would stay taken.
        weakref.finalize(stream, self._forget_unstarted, v)
        return flight.GeneratorStream(schema, stream)

    def _stream(self, v: _Viewer, backlog: list[tuple[int, pa.RecordBatch]],
                context: flight.ServerCallContext, empty: pa.RecordBatch) -> Iterator[Any]:
        try:
            for seq, b in backlog:
                if self._stopped:
                    return
                v.sent_rows += b.num_rows
                yield b, batch_meta(seq, v.dropped_rows)
            while True:
                with self._lock:
                    if not v.queue and not self._stopped:
                        v.cond.wait(HEARTBEAT_S)
                    item = v.queue.popleft() if v.queue else None
                    if item is not None:
                        v.queued_rows -= item[1].num_rows
                    dropped = v.dropped_rows
                if self._stopped or context.is_cancelled():
                    return
                if item is None:
                    yield empty, heartbeat_meta(dropped)
                else:
                    v.sent_rows += item[1].num_rows
                    yield item[1], batch_meta(item[0], dropped)
        finally:
            self._forget(v)

    def _forget_unstarted(self, v: _Viewer) -> None:
        """The generator's finalizer: it may run inside any allocation, even one made while this
        thread holds the lock, so the slot is given back on a thread of its own."""
        if not v.forgotten:
            threading.Thread(target=self._forget, args=(v,), name="tracetool-live-forget", daemon=True).start()

    def _forget(self, v: _Viewer) -> None:
        with self._lock:
            if v.forgotten:
                return
            v.forgotten = True
            t = self._tables.get(v.table)
            if t is not None and v in t.viewers:
                t.viewers.remove(v)
            n = self._viewer_ids.get(v.viewer, 0) - 1
            if n <= 0:
                self._viewer_ids.pop(v.viewer, None)
            else:
                self._viewer_ids[v.viewer] = n


class _Presented(flight.ServerMiddleware):
    """What the client sent in the authorization header (checked by the handler, which knows the peer)."""

    def __init__(self, value: str | None) -> None:
        self.value = value


class _TokenMiddleware(flight.ServerMiddlewareFactory):
    def start_call(self, info: Any, headers: Mapping[str, Any]) -> _Presented:
        values = headers.get(AUTH_HEADER) or []
        v = values[0] if values else None
        return _Presented(v.decode(errors="replace") if isinstance(v, bytes) else v)


class _Service(flight.FlightServerBase):
    """The Flight RPCs: DoGet per table, actions hello and stats, ListFlights (one per table)."""

    def __init__(self, endpoint: LiveEndpoint, location: str, certs: list[Any]) -> None:
        super().__init__(location, tls_certificates=certs or None, middleware={"token": _TokenMiddleware()})
        self._ep = endpoint

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.GeneratorStream:
        self._ep.check_token(context)
        return self._ep.open_stream(ticket.ticket, context.peer(), context)

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Iterator[flight.Result]:
        self._ep.check_token(context)
        body = action.body.to_pybytes().decode(errors="replace") if action.body is not None else ""
        if action.type == "hello":
            doc = self._ep.hello()
        elif action.type == "stats":
            doc = self._ep.stats(body or None)
        else:
            raise flight.FlightServerError(f"tracetool live: unknown action {action.type!r}")
        yield flight.Result(json.dumps(doc, default=str).encode())

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return [("hello", "instance id, meta.json, tables, limits"),
                ("stats", "rows streamed, viewers, drops, refusals")]

    def list_flights(self, context: flight.ServerCallContext, criteria: bytes) -> Iterator[flight.FlightInfo]:
        self._ep.check_token(context)
        for name in sorted(TABLES):
            desc = flight.FlightDescriptor.for_path(name)
            yield flight.FlightInfo(TABLES[name].arrow_schema, desc, [], -1, -1)


def _check_bind(addr: Address) -> None:
    """Say why a port cannot be bound in the OS's words (gRPC only says it "did not start")."""
    if addr.port == 0:
        return
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(addr.host, addr.port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(sockaddr)
    except OSError as e:
        raise UsageError(f"--live: cannot listen on {addr} ({e.strerror or e}); pick another port "
                         "(0 picks a free one)") from e


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)


def _quiet(fn: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except Exception:
            pass
    return run


def _line(e: BaseException) -> str:
    return one_line(e, 200)


__all__ = ["LiveConfig", "LiveEndpoint"]
