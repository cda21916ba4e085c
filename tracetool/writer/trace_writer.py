"""The trace writer: cheap appends on the caller's thread, Arrow I/O on a background thread.

* Producers get a table's sink (:mod:`tracetool.writer.sinks`) with
  :meth:`TraceWriter.sink` and append to it from any thread.
* A background thread drains the sinks at least every ``flush_interval_s``
  and whenever ``flush_rows`` rows are pending (it sleeps until one of those
  is due at the rows' present rate, at most a second while nothing is
  pending), and appends the record batches to ``<table>.arrows``
  (:mod:`tracetool.writer.stream`, one ``write`` per batch).
* When a table has ``max_pending_rows`` rows waiting, new rows are dropped and
  counted, never blocking the caller; the counts land in ``meta.json``.
* Nothing here raises into the caller after :meth:`TraceWriter.start`: an I/O
  failure (disk full, directory gone) stops the writer with one line on
  stderr, and later rows are counted as dropped.

What it costs is measured by ``benchmarks/bench_writer.py`` (figures in
``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracetool.errors import BadInput
from tracetool.meta import new_meta, write_meta
from tracetool.notices import say_once
from tracetool.schema import EXTENSIONS, INT_NULL, TABLES, table_file_name
from tracetool.writer.interner import Interner
from tracetool.writer.sinks import PackedSink, RowSink, Sink
from tracetool.writer.stream import StreamFile

#: The longest the flusher sleeps while no table has rows pending (see TraceWriter._next_wait).
QUIET_WAIT_S = 1.0


class Clock:
    """Time as the flusher sees it: ``now()`` in monotonic seconds, and ``wait(stop, timeout)``,
    which sleeps up to ``timeout`` seconds or until ``stop`` is set and returns whether it is.

    The writer's default is the real one; a test passes its own to drive the flusher through
    simulated time, deterministically (``tests/unit/test_roundtrip.py``)."""

    def now(self) -> float:
        return time.monotonic()

    def wait(self, stop: threading.Event, timeout: float) -> bool:
        return stop.wait(timeout)


def _warm_up() -> None:
    """Run the Arrow kernels the flusher uses once, at set-up: their first call
    initialises state for a few hundred ms while holding the GIL, which must not
    land in the middle of the host's loop."""
    codes = np.array([1, INT_NULL], dtype=np.int64)
    enc = pa.array(codes, pa.int64(), mask=codes == INT_NULL).dictionary_encode()
    pa.array(["x"], pa.string()).take(enc.indices)
    pa.array(codes, pa.int64()).cast(pa.int32(), safe=False)
    pc.less(pa.array([1]), 0)


class TraceWriter:
    """Writes a v1 trace directory while the host keeps running.

    Use as a context manager, or call :meth:`start` and :meth:`close`. Get a
    table's :class:`Sink` with :meth:`sink` and append to it from any thread.

    Args:
        directory: the trace directory (created; existing table files in it are replaced).
        meta: extra ``meta.json`` fields (``model``, ``hardware``, ...).
        flush_rows: flush a table once this many rows are pending.
        flush_interval_s: flush every table with pending rows at least this often.
        max_pending_rows: per table; beyond it rows are dropped and counted.
        segment_bytes: start a new segment file once a file grows past this.
        declare: tables to create even when they get no rows ("recorded, empty").
        compression: Arrow IPC buffer compression of batches of ``COMPRESS_MIN_ROWS`` rows or
            more, ``"lz4"`` (default: ~5x smaller files and faster than uncompressed here),
            ``"zstd"`` or None; smaller batches are written uncompressed.
        clock: the flusher's :class:`Clock` (default: the real one).
    """

    def __init__(self, directory: str | os.PathLike[str], *, meta: Mapping[str, Any] | None = None,
                 flush_rows: int = 65536, flush_interval_s: float = 1.0,
                 max_pending_rows: int = 2_000_000, segment_bytes: int = 256 << 20,
                 declare: Iterable[str] = (), compression: str | None = "lz4", clock: Clock | None = None) -> None:
        self.directory = Path(directory)
        self.meta = new_meta(**dict(meta or {}))
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.max_pending_rows = max_pending_rows
        self.segment_bytes = segment_bytes
        self.compression = compression
        self.interner = Interner()
        self.failed: str | None = None
        self._declared = set(declare)
        self._sinks: dict[str, Sink] = {}
        self._files: dict[str, StreamFile] = {}
        self._segments: dict[str, int] = {}
        self._sink_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._clock = clock or Clock()
        self._thread: threading.Thread | None = None
        #: Goes up whenever ``meta.json``'s body or the declared tables change: the flusher
        #: rewrites meta.json and the live forwarder re-sends it only then.
        self.meta_version = 0
        self._meta_written = 0  # the version meta.json on disk has
        self._closed = False
        self._started = False
        self._listeners: list[Callable[[str, pa.RecordBatch], None]] = []
        self._flushed: list[Callable[[], None]] = []

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> TraceWriter:
        """Create the directory and ``meta.json`` and start the flusher.

        Raises :class:`BadInput` when the directory cannot be written: this
        happens at set-up, before any host code runs.
        """
        if self._started:
            return self
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for p in self.directory.iterdir():
                if p.suffix[1:] in EXTENSIONS and p.is_file():
                    p.unlink()
            write_meta(self.directory, self.meta)
        except OSError as e:
            raise BadInput(f"{self.directory}: cannot write a trace here ({e.strerror or e})") from e
        self._started = True
        _warm_up()
        self._thread = threading.Thread(target=self._run, name="tracetool-writer", daemon=True)
        self._thread.start()
        atexit.register(self.close)
        return self

    def __enter__(self) -> TraceWriter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Flush everything, end every file, write the final ``meta.json``. Idempotent."""
        if self._closed or not self._started:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        with self._flush_lock:
            self._flush_all(force=True)
            for name in sorted(self._declared):
                if name not in self._files and self.failed is None and name in TABLES:
                    self._guard(lambda name=name: self._open_file(name))
            for f in self._files.values():
                if self.failed is None:
                    self._guard(f.close)
                else:
                    try:
                        f.abandon()
                    except OSError:
                        pass
            self._files.clear()
            self.meta["closed"] = True
            self.meta["closed_unix_ns"] = time.time_ns()
            self._update_drops()
            if self.failed is None:
                self._guard(lambda: write_meta(self.directory, self.meta))
            else:
                # One last try, so the trace says why it ends early and how many rows were
                # dropped (a full file system, a size limit or a lost symlink leave meta.json
                # writable; a read-only or removed directory does not, and that is fine).
                try:
                    write_meta(self.directory, self.meta)
                except OSError:
                    pass
        try:
            atexit.unregister(self.close)
        except Exception:
            pass

    # -- producer side ---------------------------------------------------------------
    def sink(self, name: str) -> Sink:
        """The sink of a v1 table (``spans``, ``tokens``, ``gpu``, ...)."""
        s = self._sinks.get(name)
        if s is not None:
            return s
        table = TABLES.get(name)
        if table is None:
            raise KeyError(f"unknown table {name!r}")
        with self._sink_lock:
            s = self._sinks.get(name)
            if s is None:
                if any(c.kind == "float" for c in table.columns):
                    s = RowSink(table, self.max_pending_rows)
                else:
                    s = PackedSink(table, self.max_pending_rows, self.interner)
                s.last_flush = self._clock.now()
                self._sinks[name] = s
                self._declared.add(name)
                self.meta_version += 1
        return s

    def note(self, text: str) -> None:
        """Add a collector note to ``meta.json`` (a source missing, a degradation)."""
        notes = self.meta.setdefault("notes", [])
        if text not in notes:
            notes.append(text)
            self.meta_version += 1

    def update_meta(self, **fields: Any) -> None:
        """Set top-level ``meta.json`` fields (``model``, ``hardware``, ...)."""
        self.meta.update(fields)
        self.meta_version += 1

    @property
    def dropped(self) -> dict[str, int]:
        return {n: s.dropped for n, s in self._sinks.items() if s.dropped}

    @property
    def declared(self) -> list[str]:
        """Tables this trace records (each gets a file, even with no rows)."""
        return sorted(self._declared)

    # -- batch listeners (the live endpoint's tap) -------------------------------------
    def add_listener(self, fn: Callable[[str, pa.RecordBatch], None], *,
                     flushed: Callable[[], None] | None = None) -> None:
        """Call ``fn(table, batch)`` after each record batch is written to the trace, and
        ``flushed()`` once after a flush that wrote any (so a listener that hands batches to a
        thread of its own wakes it once per flush, not once per table: every wake-up is a
        context switch on the host's cores, ten flushes a second while live).

        They run on the thread that flushes (the flusher, or whoever calls
        :meth:`flush`/:meth:`close`) with the flush lock held, so they must return
        at once and never block (the live endpoint only appends to bounded
        queues). An exception in one is said once on stderr and ignored.
        """
        self._listeners = [*self._listeners, fn]
        if flushed is not None:
            self._flushed = [*self._flushed, flushed]

    def remove_listener(self, fn: Callable[[str, pa.RecordBatch], None], *,
                        flushed: Callable[[], None] | None = None) -> None:
        self._listeners = [f for f in self._listeners if f is not fn]
        self._flushed = [f for f in self._flushed if f is not flushed]

    def _tell(self, fns: list[Callable[..., None]], *args: Any) -> None:
        for fn in fns:
            try:
                fn(*args)
            except Exception as e:  # a listener must never stop the writer
                say_once(f"writer-listener-{id(fn)}", f"trace listener failed ({type(e).__name__}: {e}); "
                         "ignored, the trace is still written")

    # -- flusher -----------------------------------------------------------------------
    def flush(self) -> None:
        """Write everything pending now (from any thread)."""
        with self._flush_lock:
            self._flush_all(force=True)

    def _run(self) -> None:
        while not self._clock.wait(self._stop, self._next_wait()):
            with self._flush_lock:
                if not self._closed:
                    self._flush_all(force=False)

    def _next_wait(self) -> float:
        """Sleep until the first table with rows pending is due, or until rows arriving at their
        present rate would reach ``flush_rows``, and at most
        :data:`QUIET_WAIT_S` when nothing is pending (the first rows after a quiet spell are due
        at once: they wait for the next look-in).

        Every wake-up costs the process CPU even when there is nothing to do; a fixed short
        poll made an idle recording pay more for waking than for the rows it wrote. A live
        recording (a short interval) still wakes once per interval to flush."""
        interval = self.flush_interval_s
        wait = min(QUIET_WAIT_S, interval)
        now = self._clock.now()
        for sink in list(self._sinks.values()):
            pending = sink.pending()
            rate = sink.take_rate()  # the last flush's rate: used once, just after it
            if pending:
                since = now - sink.last_flush
                wait = min(wait, interval - since)
                if pending >= self.flush_rows:
                    wait = 0.0
                elif since > 0:
                    rate = max(rate, pending / since)
            if rate > 0:
                wait = min(wait, (self.flush_rows - pending) / rate)
        return max(0.002, wait)

    def _flush_all(self, force: bool) -> None:
        now = self._clock.now()
        wrote = False
        sinks = list(self._sinks.items())
        # One table due drains them all: the interner forgets a retired string two
        # collects later, which is only safe if every collect follows a drain of every
        # table (else a row still waiting in a slower table loses its request id).
        force = force or any(
            (p := sink.pending()) and (p >= self.flush_rows or now - sink.last_flush >= self.flush_interval_s)
            for _, sink in sinks)
        for name, sink in sinks:
            if not force or not sink.pending():
                continue
            sink.mark_flushed(now)
            wrote |= self._flush_sink(name, sink)
        if wrote:
            self.interner.collect()
            if self._flushed:
                self._tell(self._flushed)
        if self.dropped != self.meta.get("dropped_rows"):
            self._update_drops()
        if self.meta_version != self._meta_written:
            self._meta_written = self.meta_version
            if self.failed is None:
                self._guard(lambda: write_meta(self.directory, self.meta))

    def _update_drops(self) -> None:
        self.meta["dropped_rows"] = self.dropped
        self.meta_version += 1

    def _flush_sink(self, name: str, sink: Sink) -> bool:
        try:
            batches = sink.drain()
        except Exception as e:  # a bug in conversion must not kill the writer thread
            say_once(f"writer-convert-{name}", f"could not convert {name} rows ({e}); they are dropped")
            return False
        if self.failed is not None:
            sink.dropped += sum(b.num_rows for b in batches)
            return False
        for batch in batches:
            if not self._guard(lambda batch=batch: self._write(name, batch)):
                sink.dropped += batch.num_rows
            else:
                sink.rows_written += batch.num_rows
                if self._listeners:
                    self._tell(self._listeners, name, batch)
        return True

    def _open_file(self, name: str) -> StreamFile:
        seg = self._segments.get(name, 0)
        fname = table_file_name(name, "arrows", f"{seg:06d}" if seg else None)
        f = StreamFile(self.directory / fname, TABLES[name].arrow_schema, self.compression)
        self._files[name] = f
        return f

    def _write(self, name: str, batch: pa.RecordBatch) -> None:
        f = self._files.get(name) or self._open_file(name)
        if f.bytes > self.segment_bytes:
            f.close(fsync=False)
            self._segments[name] = self._segments.get(name, 0) + 1
            f = self._open_file(name)
        f.write_batch(batch)

    def _guard(self, action: Any) -> bool:
        """Run an I/O action; on failure stop writing with one line on stderr."""
        if self.failed is not None:
            return False
        try:
            action()
            return True
        except OSError as e:
            self.failed = f"{e.strerror or e}"
            say_once(f"writer-failed-{self.directory}",
                     f"trace writer stopped: {self.directory}: {self.failed}; the host keeps running, "
                     "rows already flushed stay readable, later rows are counted as dropped")
            try:
                self.meta.setdefault("notes", []).append(f"writer stopped: {self.failed}")
                self.meta_version += 1
            except Exception:
                pass
            return False
