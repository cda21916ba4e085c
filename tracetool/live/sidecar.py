"""The live endpoint runs in its own small process, fed by the recording process through a pipe.

Why a process: gRPC's server shutdown waits for every running call, and a
call whose viewer stopped reading sits in a blocked write that nothing in
pyarrow can cancel; pyarrow also shuts the server down at interpreter exit
(it may crash otherwise, ARROW-16597). In the host that would turn one stalled
viewer into a server that cannot exit. In its own process the endpoint is
given ``close_timeout_s`` and then ends with ``os._exit``, whatever gRPC is
doing; the host never loads a gRPC server at all.

Host side (:class:`LiveSidecar`, what ``Recorder(live=...)`` starts through
:meth:`SidecarSpec.start_live`, made by :func:`live_spec`):

* the writer's listener (:meth:`LiveSidecar.on_batch`) appends the batch to
  a bounded queue (``queue_rows``) and returns: the flusher never waits;
* a forwarder thread writes each batch as one Arrow IPC message (no schema
  message: both ends know the v1 schemas) into the endpoint's stdin, and
  ``meta.json`` when the writer's ``meta_version`` moves; a batch that does
  not fit the queue (the endpoint process is behind) is dropped and counted;
* the endpoint process answers on its stdout, one JSON line each: ``ready``
  (its address) or ``error`` at start, then ``stats`` when asked.

The endpoint process (``python -m tracetool.live.sidecar CONFIG``) runs a
:class:`~tracetool.live.server.LiveEndpoint`, ignores Ctrl-C (the host
decides when it stops: its own session, so a terminal's SIGINT does not
reach it), and exits when told, or when its stdin closes (the host died).

Frames on the pipe: one kind byte, an 8-byte little-endian length, the payload.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pyarrow as pa

from tracetool.errors import UsageError
from tracetool.live.config import LiveConfig
from tracetool.live.priority import lower_priority
from tracetool.live.protocol import TOKEN_ENV, Address, parse_address
from tracetool.notices import say_once
from tracetool.schema import TABLES

if TYPE_CHECKING:
    from tracetool.writer import TraceWriter

BATCH, META, STATS, QUIT = b"B", b"M", b"S", b"Q"
_HEAD = struct.Struct("<cQ")


class LiveSidecar:
    """The host's handle on its endpoint process.

    Args:
        config: address, token, TLS, limits.
        meta: the trace's ``meta.json`` body now (sent when it changes).
        tables: the tables the trace records.
        writer_dropped: the writer's own dropped rows per table.
        meta_version: goes up when any of those three changes; the forwarder then re-sends them
            (and once a second regardless). None: serialise and compare them on every round.
        queue_rows: rows waiting for the endpoint process at most; beyond, batches are dropped.
    """

    def __init__(self, config: LiveConfig, *, meta: Callable[[], Mapping[str, Any]] = dict,
                 tables: Callable[[], list[str]] = list,
                 writer_dropped: Callable[[], Mapping[str, int]] = dict,
                 meta_version: Callable[[], int] | None = None, queue_rows: int = 1_000_000) -> None:
        self.config = config
        self.address: Address = parse_address(config.address)
        self.tls = config.tls_cert is not None
        self.instance = ""
        #: Rows the host could not pass to the endpoint process (it was behind, or gone).
        self.dropped = 0
        self._meta, self._tables, self._writer_dropped = meta, tables, writer_dropped
        self._queue_rows = queue_rows
        self._pending: deque[tuple[bytes, Any]] = deque()
        self._pending_rows = 0
        self._cond = threading.Condition()
        self._answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self._ask = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._forwarder: threading.Thread | None = None
        self._closing = False
        self._gone = False
        self._last_meta = ""
        self._meta_version = meta_version
        self._sent_version: int | None = None
        self._sent_at = 0.0

    @property
    def url(self) -> str:
        return self.address.uri(self.tls)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> LiveSidecar:
        """Start the endpoint process and wait until it listens.

        Raises:
            UsageError: it could not listen (port taken, bad certificate) or did not start.
        """
        self.config.check()
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
        for var in ("TRACETOOL_RECORD_DIR", "TRACETOOL_RECORD_OPTIONS"):
            env.pop(var, None)  # the endpoint process must never record itself
        token = self.config.resolved_token()
        if token:
            env[TOKEN_ENV] = token
        else:
            env.pop(TOKEN_ENV, None)
        try:
            proc = subprocess.Popen([sys.executable, "-m", "tracetool.live.sidecar",
                                     json.dumps(self.config.public())],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                    start_new_session=True)
        except OSError as e:
            raise UsageError(f"--live: cannot start the live endpoint process ({e.strerror or e})") from e
        self._proc = proc
        threading.Thread(target=self._read_answers, args=(proc.stdout,), name="tracetool-live-answers",
                         daemon=True).start()
        try:
            first = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            self._kill()
            raise UsageError(f"--live: the live endpoint did not start within {timeout_s:g} s") from None
        if "error" in first or "ready" not in first:
            self._kill()
            raise UsageError(str(first.get("error") or "the live endpoint process ended at start-up"))
        self.address = parse_address(str(first["ready"]))
        self.instance = str(first.get("instance", ""))
        self._send_meta(force=True)
        self._forwarder = threading.Thread(target=self._forward, name="tracetool-live-forward", daemon=True)
        self._forwarder.start()
        return self

    def finish(self, writer: TraceWriter) -> None:
        """Before ``writer``'s trace closes: what this endpoint served goes into its ``meta.json``."""
        finish_live(writer, self)

    def close(self) -> dict[str, Any]:
        """Stop the endpoint (after the batches already queued) and return its last stats. Idempotent."""
        with self._cond:
            if self._closing:
                return {}
            self._closing = True
            self._pending.append((QUIT, None))
            self._cond.notify()
        last: dict[str, Any] = {}
        wait = self.config.close_timeout_s + 10.0
        if self._forwarder is not None:
            self._forwarder.join(wait)
        try:
            last = self._answers.get(timeout=wait) if not self._gone else {}
        except queue.Empty:
            pass
        if self._proc is not None:
            try:
                self._proc.wait(2.0)
            except subprocess.TimeoutExpired:
                self._kill()
        return last

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            try:
                self._proc.wait(5.0)
            except subprocess.TimeoutExpired:
                pass

    # -- the writer's tap --------------------------------------------------------------------------
    def on_batch(self, table: str, batch: pa.RecordBatch) -> None:
        """Queue a written batch for the endpoint process; never blocks (full queue: dropped,
        counted). The forwarder is woken by :meth:`on_flushed`, once per flush."""
        n = batch.num_rows
        with self._cond:
            if self._closing or self._gone:
                return
            if self._pending and self._pending_rows + n > self._queue_rows:
                self.dropped += n
                return
            self._pending.append((BATCH, (table, batch)))
            self._pending_rows += n

    def on_flushed(self) -> None:
        """The writer finished a flush: wake the forwarder for what it queued."""
        with self._cond:
            if self._pending:
                self._cond.notify()

    def stats(self, viewer: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
        """The endpoint's counters (rows streamed, viewers, drops, refusals), plus the host's drops."""
        with self._ask:
            with self._cond:
                if self._closing or self._gone:
                    return {}
                self._pending.append((STATS, viewer or ""))
                self._cond.notify()
            try:
                doc = self._answers.get(timeout=timeout_s)
            except queue.Empty:
                return {}
        doc["dropped_rows_before_endpoint"] = self.dropped
        return doc

    @property
    def refused(self) -> int:
        return int(self.stats().get("refused", 0))

    # -- threads -------------------------------------------------------------------------------------
    def _read_answers(self, out: IO[bytes] | None) -> None:
        if out is None:
            return
        for line in out:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                self._answers.put(doc)
        self._gone = True
        self._answers.put({"error": "the live endpoint process ended"})

    def _forward(self) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        pipe = self._proc.stdin
        while True:
            with self._cond:
                if not self._pending:
                    self._cond.wait(0.25)
                items = list(self._pending)
                self._pending.clear()
                self._pending_rows = 0
            try:
                for kind, payload in items:
                    if kind == BATCH:
                        table, batch = payload
                        _write(pipe, BATCH, _batch_bytes(table, batch))
                    elif kind == STATS:
                        _write(pipe, STATS, str(payload).encode())
                    elif kind == QUIT:
                        self._send_meta(force=False)
                        _write(pipe, QUIT, b"")
                        pipe.close()
                        return
                self._send_meta(force=False)
                pipe.flush()
            except (OSError, ValueError) as e:  # the endpoint process is gone: the recording goes on
                self._gone = True
                lost = sum(p[1].num_rows for k, p in items if k == BATCH)
                with self._cond:
                    self.dropped += lost + self._pending_rows
                    self._pending.clear()
                say_once(f"live-gone-{id(self)}", f"live: the endpoint process stopped ({e}); viewers are "
                         "disconnected, the trace is still written")
                return

    def _send_meta(self, force: bool) -> None:
        version = self._meta_version() if self._meta_version is not None else None
        now = time.monotonic()
        if not force and version is not None and version == self._sent_version and now - self._sent_at < 1.0:
            return  # unchanged: the JSON is not built ten times a second for nothing
        self._sent_version, self._sent_at = version, now
        try:
            doc = json.dumps({"meta": dict(self._meta()), "tables": list(self._tables()),
                              "writer_dropped": dict(self._writer_dropped())}, default=str)
        except RuntimeError:  # the meta dict changed while being read: next round
            return
        if force or doc != self._last_meta:
            self._last_meta = doc
            assert self._proc is not None and self._proc.stdin is not None
            _write(self._proc.stdin, META, doc.encode())
            if force:
                self._proc.stdin.flush()


@dataclass(frozen=True)
class SidecarSpec:
    """What ``Recorder(live=...)`` takes (:class:`tracetool.recorder.LiveSpec`): a live endpoint's
    options, started as this module's sidecar on the recorder's writer."""

    config: LiveConfig

    def start_live(self, writer: TraceWriter) -> LiveSidecar:
        """Stream ``writer``'s trace with these options (:func:`start_live`)."""
        return start_live(writer, self.config)


def live_spec(live: str | LiveConfig | Mapping[str, Any]) -> SidecarSpec:
    """A live endpoint for ``Recorder(live=...)`` from an address (``"127.0.0.1:9100"``), a mapping
    of :class:`~tracetool.live.config.LiveConfig` fields or a LiveConfig.

    Raises:
        UsageError: a bad address, or a TLS key without its certificate.
    """
    return SidecarSpec(LiveConfig.of(live))


def start_live(writer: TraceWriter, live: str | LiveConfig | Mapping[str, Any]) -> LiveSidecar:
    """Stream ``writer``'s trace live: start the endpoint process, tap the writer, say where.

    The writer flushes at least every ``flush_interval_s`` from now on (the floor of the display
    lag); ``meta.json`` gets a ``live`` block. One line on stderr gives the address.

    Raises:
        UsageError: a bad address, TLS files missing, or the port cannot be bound.
    """
    cfg = LiveConfig.of(live)
    ep = LiveSidecar(cfg, meta=lambda: writer.meta, tables=lambda: writer.declared,
                     writer_dropped=lambda: writer.dropped, meta_version=lambda: writer.meta_version).start()
    writer.flush_interval_s = min(writer.flush_interval_s, cfg.flush_interval_s)
    writer.add_listener(ep.on_batch, flushed=ep.on_flushed)
    token = cfg.resolved_token() is not None
    writer.update_meta(live={"address": str(ep.address), "tls": ep.tls, "token_required": token,
                             "flush_interval_s": writer.flush_interval_s})
    guard = "token required" if token else "no token: anyone who can reach it may watch"
    try:
        print(f"tracetool: live: streaming this trace on {ep.address} ({'TLS' if ep.tls else 'plain text'}, "
              f"{guard}); watch with: tracetool attach {ep.address}", file=sys.stderr, flush=True)
    except Exception:
        pass
    return ep


def finish_live(writer: TraceWriter, ep: LiveSidecar) -> None:
    """Before the trace closes: what the endpoint served goes into ``meta.json`` (``live`` block)."""
    s = ep.stats()
    live = dict(writer.meta.get("live") or {})
    live.update(viewers_served=s.get("viewers_served"), refused=s.get("refused"),
                rows_dropped_for_viewers=s.get("dropped_rows_for_viewers"),
                rows_dropped_before_endpoint=ep.dropped)
    writer.update_meta(live=live)


def _write(pipe: IO[bytes], kind: bytes, payload: bytes | pa.Buffer) -> None:
    pipe.write(_HEAD.pack(kind, len(payload)))
    pipe.write(memoryview(payload))


def _batch_bytes(table: str, batch: pa.RecordBatch) -> bytes:
    """The table's name and the batch as one IPC message, without a schema message: both ends
    know each table's v1 schema (the writer's batches are in it), and a one-batch stream per
    batch cost the forwarder a schema, a writer and an end marker ten times a second per table."""
    return table.encode() + b"\0" + batch.serialize().to_pybytes()


def _read_batch(payload: bytes) -> tuple[str, pa.RecordBatch] | None:
    """What :func:`_batch_bytes` wrote; None for a table this endpoint does not know."""
    name, _, ipc = payload.partition(b"\0")
    table = TABLES.get(name.decode())
    if table is None:
        return None
    return table.name, pa.ipc.read_record_batch(pa.py_buffer(ipc), table.arrow_schema)


# -- the endpoint process ------------------------------------------------------------------------
def _read_exact(src: IO[bytes], n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = src.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def main(argv: list[str] | None = None) -> None:
    """Serve a trace fed on stdin; see the module docstring. Ends with ``os._exit``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    lower_priority()  # before any thread starts: the server it serves comes first (live/priority.py)
    from tracetool.live.server import LiveEndpoint

    args = sys.argv[1:] if argv is None else argv
    cfg = LiveConfig(**json.loads(args[0]))
    state: dict[str, Any] = {"meta": {}, "tables": [], "writer_dropped": {}}
    ep = LiveEndpoint(cfg, meta=lambda: state["meta"], tables=lambda: state["tables"],
                      writer_dropped=lambda: state["writer_dropped"])
    out = sys.stdout

    def answer(doc: dict[str, Any]) -> None:
        out.write(json.dumps(doc, default=str) + "\n")
        out.flush()

    try:
        ep.start()
    except Exception as e:
        answer({"error": str(e)})
        os._exit(2)
    answer({"ready": str(ep.address), "instance": ep.instance, "tls": ep.tls})
    src = sys.stdin.buffer
    while True:
        head = _read_exact(src, _HEAD.size)
        if head is None:
            break  # the host is gone
        kind, n = _HEAD.unpack(head)
        payload = _read_exact(src, n) if n else b""
        if payload is None:
            break
        if kind == BATCH:
            got = _read_batch(payload)
            if got is not None:
                ep.on_batch(*got)
        elif kind == META:
            state.update(json.loads(payload))
        elif kind == STATS:
            answer(ep.stats(payload.decode() or None))
        elif kind == QUIT:
            break
    ep.close()
    try:
        answer(ep.stats())
    finally:
        os._exit(0)  # whatever gRPC still waits for (a stalled viewer), this process ends now


if __name__ == "__main__":
    main()
