"""``tracetool attach ADDR --record DIR --duration S``: a live stream saved as a v1 trace.

Each server's batches go straight into a :class:`~tracetool.writer.TraceWriter`
(``append_batch``: they are already in the canonical schema), so the result
is an ordinary trace that ``validate``, ``analyze`` and ``tui`` read. One
address writes the trace in ``DIR``; several write one trace per server in
``DIR/server=HOST:PORT/``: a dataset (:mod:`tracetool.dataset`) whose ``server``
key is the address, so ``tracetool analyze DIR`` groups it per server.

:func:`watch_live` (``tracetool attach ADDR... --json --duration S``) watches
instead of saving: after S seconds it hands back each server's sliding window
(:class:`~tracetool.live.source.LiveSource`), and why a server has none.

``meta.json`` keeps the server's own fields (model, hardware, ...) and says
where the trace came from: a note "recorded by tracetool attach from ADDR",
a ``live_source`` block (address, server instance, seconds, reconnects,
batches missed), and ``dropped_rows`` including the rows the live stream
dropped for this viewer and those the server's writer dropped, so the
analyzers' dropped-rows finding covers them.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc

from tracetool.errors import BadInput, UsageError
from tracetool.live.client import ClientOptions, ServerConnection
from tracetool.live.protocol import Address
from tracetool.live.window import WindowSpec, valid_rows
from tracetool.meta import check_meta, read_meta, write_meta
from tracetool.reader import Trace
from tracetool.writer import TraceWriter
from tracetool.writer.output import prepare_output

#: meta.json fields the writer of the copy owns (the server's values are not copied).
_OWN = {"format", "version", "created_unix_ns", "closed", "closed_unix_ns", "dropped_rows", "notes", "producer", "live"}


@dataclass
class ServerRecording:
    """What was recorded from one server."""

    address: Address
    directory: Path
    connected: bool = False
    refused: str | None = None
    reason: str = ""
    rows: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    reconnects: int = 0
    gaps: int = 0

    @property
    def tokens(self) -> int:
        return self.rows.get("tokens", 0)


@dataclass
class RecordResult:
    out: Path
    servers: list[ServerRecording]
    elapsed_s: float
    interrupted: bool = False


class _Recorder:
    """One server's connection writing into one trace directory."""

    def __init__(self, address: Address, directory: Path, options: ClientOptions) -> None:
        self.rec = ServerRecording(address, directory)
        self.writer = TraceWriter(directory, meta={"producer": {"name": "tracetool attach --record"}},
                                  flush_interval_s=0.5)
        self.server_meta: dict[str, Any] = {}
        self.instances: list[str] = []
        self.broken_rows = 0
        self.conn = ServerConnection(address, self._hello, self._batch, options)

    def _hello(self, conn: ServerConnection, hello: dict[str, Any], new: bool) -> None:
        raw = hello.get("meta")
        meta: dict[str, Any] = dict(raw) if isinstance(raw, dict) else {}
        self.server_meta = meta
        self.writer.update_meta(**_valid_fields({k: v for k, v in meta.items() if k not in _OWN}))
        for t in hello.get("tables") or []:
            try:
                self.writer.sink(t)
            except KeyError:
                pass
        if new:
            self.instances.append(str(hello.get("instance")))

    def _batch(self, conn: ServerConnection, table: str, batch: pa.RecordBatch) -> None:
        sink = self.writer.sink(table)
        keep = valid_rows(table, batch)
        if keep is not None:
            bad = batch.num_rows - int(pc.sum(pc.cast(keep, pa.int64())).as_py() or 0)
            if bad:  # a server that breaks the v1 row rules must not make the saved trace invalid
                sink.dropped += bad
                if not self.broken_rows:
                    self.writer.note(f"attach: rows from {self.rec.address} that break the v1 row rules "
                                     "(nulls in required columns, end before start, unknown clock, "
                                     "negative index) were not saved; counted in dropped_rows")
                self.broken_rows += bad
                batch = batch.filter(keep)
        sink.append_batch(batch)


def record_live(addresses: Sequence[Address], out: Path, duration_s: float, *,
                options: ClientOptions | None = None, force: bool = False,
                stop: threading.Event | None = None,
                progress: Callable[[str], None] | None = None,
                beside: Callable[[TraceWriter], Callable[[], None]] | None = None) -> RecordResult:
    """Record live servers for ``duration_s`` seconds (or until ``stop`` is set) into ``out``.

    ``beside(writer)``, with one server, starts something that writes into the same trace (the
    server's scraped metrics: ``tracetool attach --metrics-url``) and returns its stop.

    Raises:
        UsageError: ``out`` is not empty (without ``force``) or not a directory.
        BadInput: ``out`` cannot be written.
    """
    out = Path(out)
    prepare_output(out, force, create=False)
    repeated = _repeated(addresses)
    if repeated is not None:
        raise UsageError(f"ADDR {repeated} is given twice (its two recordings would share a directory)")
    opts = options or ClientOptions()
    dirs = [out] if len(addresses) == 1 else [out / server_folder(a) for a in addresses]
    recs = [_Recorder(a, d, opts) for a, d in zip(addresses, dirs, strict=True)]
    for r in recs:
        r.writer.start()
    stop = stop or threading.Event()
    t0 = time.monotonic()
    interrupted = False
    # something recorded beside the stream into the (one) trace, e.g. the server's scraped metrics:
    # started with the writer, stopped before the trace is finished
    stop_beside = beside(recs[0].writer) if beside is not None and len(recs) == 1 else None
    for r in recs:
        r.conn.start()
    with _stop_on_sigterm(stop) as terminated:  # installed while saving too: a second TERM waits
        try:
            stop.wait(duration_s)
        except KeyboardInterrupt:
            interrupted = True
        interrupted = interrupted or bool(terminated)
        elapsed = time.monotonic() - t0
        for r in recs:
            r.conn.stop()
        if stop_beside is not None:
            stop_beside()
        for r in recs:
            _finish(r, elapsed, opts)
    result = RecordResult(out, [r.rec for r in recs], elapsed, interrupted)
    if progress is not None:
        for s in result.servers:
            progress(_summary(s))
    return result


@contextmanager
def _stop_on_sigterm(stop: threading.Event) -> Iterator[list[int]]:
    """SIGTERM (``kill``, ``timeout``, a CI job cancelled, ``docker stop``) ends the recording the
    way Ctrl-C does, saved first, instead of killing the process with its last rows unwritten.
    Yields a list that holds the signal once one came. Only the main thread can take signals:
    elsewhere (a caller's thread) nothing is installed."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def handler(signum: int, frame: Any) -> None:
        got.append(signum)
        stop.set()

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, old)


def _finish(r: _Recorder, elapsed: float, opts: ClientOptions) -> None:
    c, rec = r.conn, r.rec
    rec.connected = c.connects > 0
    rec.refused = c.refusal
    rec.reason = c.reason
    rec.rows = dict(c.rows)
    rec.dropped = c.dropped
    rec.reconnects = max(0, c.connects - 1)
    rec.gaps = c.gaps
    raw_dropped = r.server_meta.get("dropped_rows")
    server_dropped = {str(k): int(v) for k, v in (raw_dropped.items() if isinstance(raw_dropped, dict) else ())
                      if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 2**62}
    w = r.writer
    history = ", with the server's recent history from before the attach" if opts.history else ""
    w.note(f"recorded by tracetool attach from {rec.address} (a live stream{history})")
    notes = r.server_meta.get("notes")
    for n in notes if isinstance(notes, list) else []:
        w.note(f"server: {n}")
    if not rec.connected:
        w.note(f"nothing received: {rec.reason or 'the server was not reachable'}")
    if rec.dropped:
        w.note(f"the live stream dropped {sum(rec.dropped.values()):,} rows for this viewer (its buffer on "
               "the server was full): this trace misses them")
    if rec.gaps:
        w.note(f"{rec.gaps} batches aged out of the server's history while disconnected: this trace misses them")
    if len(r.instances) > 1:
        w.note("the server restarted during the recording: this trace holds several of its recordings")
    w.update_meta(live_source={"address": str(rec.address), "instances": r.instances, "seconds": round(elapsed, 3),
                               "reconnects": rec.reconnects, "batches_missed": rec.gaps,
                               "dropped_rows_in_stream": rec.dropped, "tls": opts.use_tls,
                               "history": opts.history, "producer": r.server_meta.get("producer")})
    w.close()
    # The writer sets dropped_rows to its own drops at close; add the stream's and the server's.
    try:
        meta = read_meta(w.directory)
        total = dict(meta.get("dropped_rows") or {})
        for src in (rec.dropped, server_dropped):
            for k, v in src.items():
                total[k] = int(total.get(k, 0)) + int(v)
        meta["dropped_rows"] = total
        write_meta(w.directory, meta)
    except (OSError, BadInput) as e:
        raise BadInput(f"{w.directory}: cannot finish meta.json ({e})") from e


def _valid_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """The server's meta.json fields that keep the copy a valid trace (the stream is input: a
    ``model`` that is not an object, or a negative size, would make the saved trace invalid)."""
    out = {}
    for k, v in fields.items():
        try:
            check_meta({"format": "tracetool", "version": 1, k: v})
        except BadInput:
            continue
        out[k] = v
    return out


def _summary(s: ServerRecording) -> str:
    if not s.connected:
        return f"{s.address}: nothing recorded ({s.reason or 'not reachable'}); empty trace in {s.directory}"
    dropped = sum(s.dropped.values())
    extra = f", {dropped:,} rows dropped by the stream" if dropped else ""
    extra += f", {s.reconnects} reconnects" if s.reconnects else ""
    return (f"{s.address}: recorded {s.tokens:,} tokens, {s.rows.get('spans', 0):,} spans into "
            f"{s.directory}{extra}")


#: The dataset key a server's address is under (``DIR/server=HOST:PORT``, the live document's groups).
SERVER_KEY = "server"


def server_folder(a: Address) -> str:
    """``server=HOST:PORT``: the hive-style folder of one server's trace (and its label in a live
    fleet's analysis). What a path cannot hold is percent-escaped (``%2F``), as
    :func:`tracetool.dataset.hive_keys` decodes it, so the ``server`` key reads back as the address."""
    return f"{SERVER_KEY}={quote(str(a), safe=':[]')}"


def _repeated(addresses: Sequence[Address]) -> Address | None:
    seen: set[Address] = set()
    for a in addresses:
        if a in seen:
            return a
        seen.add(a)
    return None


# -- watching: a live fleet's windows after S seconds ------------------------------------------

@dataclass
class WatchedServer:
    """One server's window at the end of a watch, or why it has none."""

    address: Address
    trace: Trace | None
    connected: bool
    refused: str | None
    reason: str
    tokens: int

    @property
    def why_empty(self) -> str:
        """Why there is nothing to analyse ("" when there is)."""
        if self.trace is not None:
            return ""
        if self.refused:
            return f"refused: {self.refused}"
        if not self.connected:
            return f"not reachable ({self.reason})" if self.reason else "no answer while watched"
        return f"connected, but no request in the window ({self.tokens:,} tokens received)"


@dataclass
class WatchResult:
    servers: list[WatchedServer]
    window: WindowSpec
    elapsed_s: float
    interrupted: bool = False


def watch_live(addresses: Sequence[Address], duration_s: float, *, options: ClientOptions | None = None,
               window: WindowSpec | None = None, connect_timeout_s: float | None = None,
               stop: threading.Event | None = None) -> WatchResult:
    """Watch live servers for ``duration_s`` seconds (or until ``stop``, Ctrl-C or SIGTERM), then
    take each one's window (the same :class:`~tracetool.live.window.ServerWindow` the viewer
    analyses: last ``window.seconds`` of its clock, last ``window.requests`` requests).

    With ``connect_timeout_s``, waits that long at most for every server's first answer, and a
    refused token or a TLS mismatch is raised at once instead of watched for S seconds.

    Raises:
        UsageError: an address given twice.
        BadInput: (with ``connect_timeout_s``) a server refused the token, or TLS failed.
    """
    from tracetool.live.source import LiveSource

    repeated = _repeated(addresses)
    if repeated is not None:
        raise UsageError(f"ADDR {repeated} is given twice")
    stop = stop or threading.Event()
    source = LiveSource(addresses, options=options, window=window)
    t0 = time.monotonic()
    interrupted = False
    try:
        with _stop_on_sigterm(stop) as terminated:
            try:
                if connect_timeout_s is not None:
                    source.wait_first(min(connect_timeout_s, duration_s))
                stop.wait(max(0.0, duration_s - (time.monotonic() - t0)))
            except KeyboardInterrupt:
                interrupted = True
            interrupted = interrupted or bool(terminated)
        elapsed = time.monotonic() - t0
        # stop the readers first: a batch a reader took before the interrupt is in the window when
        # it is read (the first batch of a stream can take a reader a second: pyarrow imports pandas)
        source.close()
        servers = []
        for c, w in zip(source.connections, source.windows, strict=True):
            w.dropped = c.dropped
            servers.append(WatchedServer(c.address, w.trace(), c.connects > 0, c.refusal, c.reason,
                                         w.tokens_total))
    finally:
        source.close()
    return WatchResult(servers, source.spec, elapsed, interrupted)


__all__ = ["SERVER_KEY", "RecordResult", "ServerRecording", "WatchResult", "WatchedServer", "record_live",
           "server_folder", "watch_live"]
