"""The viewer's side of a live endpoint: one connection per server, reconnecting with backoff.

:class:`ServerConnection` runs one supervisor thread per server. It says
``hello`` (the server's instance, ``meta.json`` and tables), then opens one
``DoGet`` stream per table, each read by its own thread (gRPC reads release
the GIL), and hands every record batch to the ``on_batch`` callback. When a
stream breaks, ends, or stays silent longer than ``DEAD_AFTER_S`` (the server
sends a heartbeat every second), every stream of that server is cancelled and
the supervisor reconnects after a backoff (0.5 s doubling to 5 s). Resuming
against the same server instance asks for the batches after the last sequence
number received, so nothing arrives twice; a restarted server (a new
instance) starts over with its history snapshot.

Nothing here raises into the caller after :meth:`ServerConnection.start`: a
failure becomes the connection's state (``disconnected``, ``refused``) and a
one-line reason, which the header shows.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from tracetool.live import quiet_grpc  # noqa: F401  (before any gRPC channel or server: no INFO lines on stderr)
from tracetool.live.protocol import AUTH_HEADER, DEAD_AFTER_S, STREAMED, Address, read_meta, ticket
from tracetool.untrusted import clip

#: Connection states.
CONNECTING, CONNECTED, DISCONNECTED, REFUSED, STOPPED = (
    "connecting", "connected", "disconnected", "refused", "stopped")


@dataclass(frozen=True)
class ClientOptions:
    """How to reach live endpoints (``tracetool attach`` flags).

    Attributes:
        token: the shared token (``--token`` / ``$TRACETOOL_LIVE_TOKEN``), None for none.
        tls: connect with TLS (implied by ``tls_root``).
        tls_root: PEM of the CA (or the self-signed certificate) to trust; None: system roots.
        history: ask for the server's recent-history snapshot on the first connection.
        connect_timeout_s: how long ``hello`` may take before the attempt counts as failed.
        backoff_s, backoff_max_s: the first retry delay and its cap (doubling in between).
        dead_after_s: a stream silent this long is taken for dead.
    """

    token: str | None = None
    tls: bool = False
    tls_root: bytes | None = None
    history: bool = True
    connect_timeout_s: float = 5.0
    backoff_s: float = 0.5
    backoff_max_s: float = 5.0
    dead_after_s: float = DEAD_AFTER_S

    @property
    def use_tls(self) -> bool:
        return self.tls or self.tls_root is not None


OnHello = Callable[["ServerConnection", dict[str, Any], bool], None]
OnBatch = Callable[["ServerConnection", str, pa.RecordBatch], None]


class _Session:
    """One connected period: a client, its streams, and why it ended."""

    def __init__(self) -> None:
        self.ended = threading.Event()
        self.reason = ""
        self.readers: list[Any] = []
        self.last_seen: dict[str, float] = {}
        self.dropped: dict[str, int] = {}
        self.lock = threading.Lock()

    def finish(self, table: str) -> None:
        """One table's stream ended cleanly. The session ends when every table's has: a server
        that shuts down ends them one after another, and cancelling the rest at the first end
        would throw away the final batches still on their way."""
        with self.lock:
            self.last_seen.pop(table, None)  # every table's stream has a key until it ends
            done = not self.last_seen
        if done:
            self.fail("the server ended the stream")

    def fail(self, reason: str) -> None:
        with self.lock:
            if not self.ended.is_set():
                self.reason = reason
                self.ended.set()


class ServerConnection:
    """A live server being watched: state, counters, and the threads that read it.

    Args:
        address: the server's ``HOST:PORT``.
        on_hello: called with ``(connection, hello, new_instance)`` after each (re)connection;
            ``new_instance`` is True for the first one and after a server restart.
        on_batch: called with ``(connection, table, batch)`` for every non-empty batch, on a
            reader thread; it must be quick and thread-safe.
        options: token, TLS, backoff.
    """

    def __init__(self, address: Address, on_hello: OnHello, on_batch: OnBatch,
                 options: ClientOptions | None = None) -> None:
        self.address = address
        self.options = options or ClientOptions()
        self._on_hello = on_hello
        self._on_batch = on_batch
        self.viewer = uuid.uuid4().hex
        self.state = CONNECTING
        self.reason = ""
        self.retry_at: float | None = None
        self.instance: str | None = None
        self.hello: dict[str, Any] = {}
        self.connects = 0
        self.attempts = 0
        self.rows: dict[str, int] = {}
        self.batches = 0
        self.gaps = 0
        #: Why the server last refused this viewer (its token), None once admitted again.
        self.refusal: str | None = None
        self._dropped_before: dict[str, int] = {}
        self._after: dict[str, int] = {}
        self._session: _Session | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Set once the first attempt has an outcome (connected, refused or failed).
        self.first_outcome = threading.Event()

    # -- public --------------------------------------------------------------------------------
    def start(self) -> ServerConnection:
        self._thread = threading.Thread(target=self._supervise, name=f"tracetool-live-{self.address}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Cancel the streams and end the threads (waits at most ``timeout``)."""
        self._stop.set()
        s = self._session
        if s is not None:
            s.fail("stopped")
        if self._thread is not None:
            self._thread.join(timeout)
        self.state = STOPPED

    @property
    def dropped(self) -> dict[str, int]:
        """Rows the server could not queue for this viewer (its buffer was full), per table."""
        out = dict(self._dropped_before)
        s = self._session
        if s is not None:
            for k, v in list(s.dropped.items()):
                out[k] = out.get(k, 0) + v
        return {k: v for k, v in out.items() if v}

    def status(self) -> str:
        """``connected``, ``connecting``, ``disconnected (why), retrying in 2 s``, ``refused: ...``."""
        state = self.state
        if state in (DISCONNECTED, REFUSED):
            wait = max(0.0, (self.retry_at or 0.0) - time.monotonic())
            why = f" ({self.reason})" if state == DISCONNECTED and self.reason else ""
            head = f"refused: {self.reason}" if state == REFUSED else f"disconnected{why}"
            return f"{head}, retrying in {wait:.0f} s" if wait >= 0.5 else f"{head}, retrying"
        return state

    def stats(self, timeout: float = 2.0) -> dict[str, Any]:
        """The server's ``stats`` action (rows streamed, viewers, drops); raises Flight errors."""
        client = self._client()
        try:
            res = client.do_action(flight.Action("stats", self.viewer.encode()), self._call(timeout))
            return dict(json.loads(next(iter(res)).body.to_pybytes()))
        finally:
            client.close()

    # -- the supervisor ------------------------------------------------------------------------
    def _client(self) -> flight.FlightClient:
        o = self.options
        return flight.FlightClient(self.address.uri(o.use_tls), tls_root_certs=o.tls_root)

    def _call(self, timeout: float | None = None) -> flight.FlightCallOptions:
        headers = [(AUTH_HEADER.encode(), f"Bearer {self.options.token}".encode())] if self.options.token else []
        return flight.FlightCallOptions(timeout=timeout, headers=headers)

    def _supervise(self) -> None:
        delay = self.options.backoff_s
        while not self._stop.is_set():
            self.attempts += 1
            outcome = self._connect_and_stream()
            self.first_outcome.set()
            if self._stop.is_set():
                break
            if outcome == "ok":  # a session that connected: the next retry starts short
                delay = self.options.backoff_s
            self.retry_at = time.monotonic() + delay
            if self._stop.wait(delay):
                break
            delay = min(delay * 2, self.options.backoff_max_s)
        self.state = STOPPED

    def _connect_and_stream(self) -> str:
        """One connection: hello, every table's stream until one breaks. Returns ok/failed/refused."""
        try:
            client = self._client()
        except (flight.FlightError, pa.ArrowException, OSError, ValueError) as e:
            self._set(DISCONNECTED, _short(e))
            return "failed"
        session = _Session()
        try:
            try:
                res = client.do_action(flight.Action("hello", b""), self._call(self.options.connect_timeout_s))
                hello = json.loads(next(iter(res)).body.to_pybytes())
                if not isinstance(hello, dict):
                    raise ValueError(f"the server's hello is not a JSON object ({type(hello).__name__})")
            except flight.FlightUnauthenticatedError as e:
                self._set(REFUSED, _short(e, refused=True))
                return "refused"
            except (flight.FlightError, pa.ArrowException, OSError, ValueError, StopIteration) as e:
                self._set(DISCONNECTED, _short(e))
                return "failed"
            new = hello.get("instance") != self.instance
            if new:
                if self.instance is not None:
                    self._after.clear()
                self.instance = hello.get("instance")
            self.hello = hello
            try:
                self._on_hello(self, hello, new)
            except Exception as e:  # the viewer's callback must not end the connection loop
                self.reason = f"hello callback failed: {e}"
            self._session = session
            now = time.monotonic()
            threads = []
            for table in STREAMED:
                session.last_seen[table] = now
                t = threading.Thread(target=self._read, args=(client, table, session, self.connects == 0),
                                     name=f"tracetool-live-{table}", daemon=True)
                threads.append(t)
            self.connects += 1
            self._set(CONNECTED, "")
            for t in threads:
                t.start()
            while not session.ended.wait(0.25):
                if self._stop.is_set():
                    session.fail("stopped")
                    break
                with session.lock:
                    seen = min(session.last_seen.values(), default=None)
                silent = 0.0 if seen is None else time.monotonic() - seen
                if silent > self.options.dead_after_s:
                    session.fail(f"no data or heartbeat for {silent:.0f} s")
            for r in list(session.readers):
                try:
                    r.cancel()
                except Exception:
                    pass
            for t in threads:
                t.join(1.0)
            if not self._stop.is_set():
                self._set(DISCONNECTED, session.reason)
            return "ok"
        finally:
            self._session = None
            for k, v in session.dropped.items():
                self._dropped_before[k] = self._dropped_before.get(k, 0) + v
            try:
                client.close()
            except Exception:
                pass

    def _read(self, client: flight.FlightClient, table: str, session: _Session, first: bool) -> None:
        try:
            tk = ticket(table, self.viewer, instance=self.instance, after=self._after.get(table, -1),
                        history=self.options.history or not first)
            reader = client.do_get(flight.Ticket(tk), self._call())
            session.readers.append(reader)
            while not session.ended.is_set():
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    session.finish(table)
                    return
                session.last_seen[table] = time.monotonic()  # the key exists until finish() pops it
                meta = read_meta(chunk.app_metadata)
                if "dropped" in meta:
                    session.dropped[table] = int(meta["dropped"])
                data = chunk.data
                if data is None or data.num_rows == 0:
                    continue
                seq = int(meta.get("seq", -1))
                last = self._after.get(table, -1)
                if seq != -1 and last != -1:
                    if seq <= last:
                        continue  # already received before a reconnect
                    if seq > last + 1:
                        self.gaps += seq - last - 1  # batches that aged out of the server's history
                self._after[table] = seq
                self.rows[table] = self.rows.get(table, 0) + data.num_rows
                self.batches += 1
                try:
                    self._on_batch(self, table, data)
                except Exception as e:  # a bad batch must not end the stream
                    self.reason = f"batch callback failed: {e}"
        except flight.FlightUnauthenticatedError as e:
            self._set(REFUSED, _short(e, refused=True))
            session.fail(_short(e, refused=True))
        except Exception as e:
            session.fail(_short(e))

    def _set(self, state: str, reason: str) -> None:
        self.state, self.reason = state, reason
        if state == REFUSED:
            self.refusal = reason
        elif state == CONNECTED:
            self.refusal = None
            self.retry_at = None
            self.first_outcome.set()


def _short(e: BaseException, refused: bool = False) -> str:
    """One short reason for the header: gRPC's messages are long and multi-line."""
    text = " ".join(str(e).split())
    if refused:
        if "wrong token" in text:
            return "wrong token"
        if "no token" in text:
            return "no token given (the server requires one)"
        return "not authorised"
    low = text.lower()
    if "wrong version number" in low:
        return "TLS handshake failed: the server does not speak TLS (drop --tls/--tls-root)"
    if "certificate" in low:
        return "TLS: the server's certificate is not trusted (give its CA with --tls-root)"
    if "ssl" in low or "handshake" in low:
        return "TLS handshake failed"
    if "connection refused" in low:
        return "connection refused"
    if "socket closed" in low and "failed to connect" in low:
        return "the server closed the connection (a TLS server? use --tls-root)"
    if "deadline" in low or "timed out" in low or isinstance(e, flight.FlightTimedOutError):
        return "timed out"
    if "cancel" in low:
        return "stream cancelled"
    if "socket closed" in low or "connection reset" in low or "unavailable" in low:
        return "connection lost"
    return clip(text, 80)


__all__ = ["CONNECTED", "CONNECTING", "DISCONNECTED", "REFUSED", "STOPPED", "ClientOptions",
           "ServerConnection"]
