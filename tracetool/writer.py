"""Streaming trace writer: cheap appends on the caller's thread, Arrow I/O on a background thread.

Design (measured in ``benchmarks/bench_writer.py``):

* Tables whose columns are all integers or strings (spans, tokens, steps,
  stacks, requests) buffer rows as packed int64s in one ``array.array`` per
  table. A row is appended with one ``struct.pack`` + ``frombytes``: a single C
  call, so rows from several threads never interleave, and a bad value fails
  before anything is appended. Strings travel as codes of a shared
  :class:`Interner`; a null travels as :data:`tracetool.schema.INT_NULL`.
* Tables with float columns (gpu) buffer Python tuples; they are low-rate.
* A background thread drains the buffers at least every ``flush_interval_s``
  and whenever ``flush_rows`` rows are pending (it sleeps until one of those is
  due at the rows' present rate, at most a second while nothing is pending),
  turns them into Arrow record batches (numpy views, no per-value Python work)
  and appends them to
  ``<table>.arrows`` (Arrow IPC stream). Each batch goes out in one ``write``,
  so a killed process leaves a readable prefix.
* When a table has ``max_pending_rows`` rows waiting, new rows are dropped and
  counted, never blocking the caller; the counts land in ``meta.json``.
* Nothing here raises into the caller after :meth:`TraceWriter.start`: an I/O
  failure (disk full, directory gone) stops the writer with one line on
  stderr, and later rows are counted as dropped.
"""

from __future__ import annotations

import array
import atexit
import ctypes
import functools
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracetool.errors import BadInput
from tracetool.meta import new_meta, write_meta
from tracetool.native import load_optional
from tracetool.notices import say_once
from tracetool.schema import INT_NULL, TABLES, Table, table_file_name

#: :mod:`tracetool._cpack` when available (tests set it to None for the numpy path)
_cpack: Any = load_optional("tracetool._cpack")
#: Flushes of up to this many rows go through the C packer; larger ones through numpy, whose
#: vectorised string lookup (distinct codes only) is faster for a big flush's repeated ids.
CPACK_MAX_ROWS = 4096


class Interner:
    """Maps strings to int64 codes for the packed buffers; thread-safe.

    Codes are never reused. A code can be retired (a finished request id) and
    is forgotten two flushes later, so a long-running server does not keep
    every request id it ever saw. A pinned code (:meth:`pin`) is never
    forgotten, so a producer may keep it (span names, clocks) instead of
    asking for it on every row.
    """

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}
        self._strings: dict[int, str] = {}
        self._next = 0
        self._lock = threading.Lock()
        self._retired: list[int] = []
        self._retiring: list[int] = []
        self._pinned: set[int] = set()

    def code(self, s: str) -> int:
        c = self._codes.get(s)
        if c is None:
            with self._lock:
                c = self._codes.get(s)
                if c is None:
                    c = self._next
                    self._next += 1
                    self._strings[c] = s
                    self._codes[s] = c
        return c

    def pin(self, s: str) -> int:
        """The code of ``s``, kept for good (retiring it, as a request id that happens to equal
        a span name, does not make it forgotten)."""
        c = self.code(s)
        with self._lock:
            self._pinned.add(c)
        return c

    def retire(self, code: int) -> None:
        self._retired.append(code)

    def lookup(self, codes: Iterable[int]) -> list[str | None]:
        get = self._strings.get
        return [get(int(c)) for c in codes]

    def collect(self) -> None:
        """Called by the flusher after a drain: forget codes retired two drains ago."""
        with self._lock:
            old, self._retiring = self._retiring, self._retired
            self._retired = []
            for c in old:
                if c in self._pinned:
                    continue
                s = self._strings.pop(c, None)
                if s is not None and self._codes.get(s) == c:
                    del self._codes[s]

    def __len__(self) -> int:
        return len(self._strings)


class Sink:
    """Where the rows of one table wait for the flusher. Subclasses pick the buffer."""

    def __init__(self, table: Table, max_pending_rows: int) -> None:
        self.table = table
        self.schema = table.arrow_schema
        self.max_pending_rows = max_pending_rows
        self.dropped = 0
        self.rows_written = 0
        self.last_flush = time.monotonic()
        #: rows per second up to the last flush: when the next one is due (TraceWriter._next_wait)
        self.rate = 0.0
        self._batches: list[pa.RecordBatch] = []
        self._feeds: list[tuple[Sized, Callable[[], Any], Callable[[Any], Mapping[str, Any]]]] = []

    def pending(self) -> int:
        raise NotImplementedError

    def tuple_feed(self, convert: Callable[[list[Any]], Mapping[str, Any]]) -> list[Any]:
        """A list a hot path appends raw tuples of its own shape to, converted off that path.

        The producer checks ``len(feed) < sink.max_pending_rows`` (else counts
        ``sink.dropped``) and appends; the flusher takes what is there and
        ``convert(tuples)`` gives the table's columns (a mapping as
        :meth:`append_batch` takes), vectorised. ``list.append`` is the one
        hand-off that stays cheap inside a real model loop, where the
        interpreter's common paths are the only code still in the CPU caches
        between calls (``struct.pack`` + ``array.frombytes`` cost a step 4-5 µs
        more there; ``benchmarks/bench_hooks.py``).
        """
        feed: list[Any] = []
        self.add_feed(feed, functools.partial(_take_list, feed), convert)
        return feed

    def add_feed(self, feed: Sized, take: Callable[[], Any], convert: Callable[[Any], Mapping[str, Any]]) -> None:
        """Drain ``feed`` at every flush: ``len(feed)`` rows are pending, ``take()`` removes and
        returns them in the producer's own form, ``convert`` turns that into columns as
        :meth:`append_batch` takes them. :meth:`tuple_feed` is one; the C step slot's row
        buffer (``collectors.torch_hooks._cstep.StepRows``) is another."""
        self._feeds.append((feed, take, convert))

    def append(self, values: Sequence[Any]) -> None:
        """Append one row given as plain values in the table's column order (None = null)."""
        raise NotImplementedError

    def append_batch(self, data: Mapping[str, Any] | pa.RecordBatch | pa.Table) -> None:
        """Append many rows at once, column-wise (the cheap path for batched engines).

        ``data`` maps column names to sequences, numpy arrays or Arrow arrays;
        absent optional columns are null. Bad data raises here, in the caller,
        since this is not a hot per-token path.
        """
        batch = conform_batch(self.table, data)
        if batch.num_rows == 0:
            return
        if self._pending_batch_rows() + batch.num_rows > self.max_pending_rows:
            self.dropped += batch.num_rows
            return
        self._batches.append(batch)

    def _feed_rows(self) -> int:
        return sum(len(f) for f, _, _ in self._feeds)

    def _drain_feeds(self, out: list[pa.RecordBatch]) -> None:
        for feed, take, convert in self._feeds:
            if not len(feed):
                continue
            batch = conform_batch(self.table, convert(take()))
            if batch.num_rows:
                out.append(batch)

    def _pending_batch_rows(self) -> int:
        return sum(b.num_rows for b in list(self._batches))

    def drain(self) -> list[pa.RecordBatch]:
        """Take what is pending as record batches (flusher thread only)."""
        out: list[pa.RecordBatch] = []
        n = len(self._batches)
        if n:
            out.extend(self._batches[:n])
            del self._batches[:n]
        if self._feeds:
            self._drain_feeds(out)
        rows = self._drain_rows()
        if rows is not None and rows.num_rows:
            out.append(rows)
        return out

    def _drain_rows(self) -> pa.RecordBatch | None:
        raise NotImplementedError


def _take_list(feed: list[Any]) -> list[Any]:
    n = len(feed)
    chunk = feed[:n]
    del feed[:n]  # tuples appended meanwhile stay for the next drain (each list op is atomic)
    return chunk


class PackedSink(Sink):
    """Rows of int64s (strings as interner codes) packed into one ``array('q')``."""

    def __init__(self, table: Table, max_pending_rows: int, interner: Interner) -> None:
        super().__init__(table, max_pending_rows)
        self.interner = interner
        self.ncols = len(table.columns)
        self.buf = array.array("q")
        #: ``pack(*ints)`` gives the bytes of one row; hot paths call
        #: ``buf.frombytes(pack(...))`` directly after checking :meth:`full`.
        self.pack = struct.Struct(f"={self.ncols}q").pack
        self.max_items = max_pending_rows * self.ncols
        self._is_str = [c.kind == "string" for c in table.columns]
        #: the C packer's column kinds, and the struct ArrowArray it fills (flusher thread only)
        self._kinds = _c_kinds(table)
        self._c_array = ctypes.create_string_buffer(_ARROW_ARRAY_SIZE)

    def pending(self) -> int:
        return len(self.buf) // self.ncols + self._pending_batch_rows() + self._feed_rows()

    def full(self) -> bool:
        return len(self.buf) >= self.max_items

    def append(self, values: Sequence[Any]) -> None:
        if len(self.buf) >= self.max_items:
            self.dropped += 1
            return
        code = self.interner.code
        ints = [
            INT_NULL if v is None else (code(str(v)) if is_str else int(v))
            for v, is_str in zip(values, self._is_str, strict=True)
        ]
        self.buf.frombytes(self.pack(*ints))

    def _drain_rows(self) -> pa.RecordBatch | None:
        n = len(self.buf) // self.ncols * self.ncols
        if n == 0:
            return None
        chunk = self.buf[:n]
        del self.buf[:n]
        if _cpack is not None and self._kinds is not None and n <= CPACK_MAX_ROWS * self.ncols:
            batch = self._c_batch(chunk)
            if batch is not None:
                return batch
        rows = np.frombuffer(chunk, dtype=np.int64).reshape(-1, self.ncols)
        # blocked transpose: one cache-friendly pass instead of a strided pass per column
        cols = np.empty((self.ncols, len(rows)), dtype=np.int64)
        for a in range(0, len(rows), 4096):
            cols[:, a:a + 4096] = rows[a:a + 4096].T
        # the null checks of every column in three numpy calls, not three per column: a live
        # recording flushes a few rows ten times a second, where per-call costs are the flush
        null = cols == INT_NULL
        any_null = null.any(axis=1).tolist()
        all_null = null.all(axis=1).tolist()
        arrays = []
        for j, col in enumerate(self.table.columns):
            if self._is_str[j]:
                arrays.append(self._strings(cols[j]))
            elif all_null[j]:
                arrays.append(pa.nulls(len(rows), col.type))
            else:
                arrays.append(_int_array(cols[j], col.type, null[j] if any_null[j] else None))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _c_batch(self, chunk: array.array[int]) -> pa.RecordBatch | None:
        """The rows as one record batch built by the C packer (~10 µs for a live flush's few
        dozen rows, against ~100 µs through numpy and one pyarrow call per column); None when it
        cannot (the numpy path then does it, and says why if it cannot either)."""
        address = ctypes.addressof(self._c_array)
        return _import_packed(address, self.schema, _cpack.pack, chunk, self.ncols, self._kinds,
                              self.interner._strings, address)

    def _strings(self, codes: np.ndarray) -> pa.Array:
        if len(codes) <= SMALL_STRING_ROWS:  # a small flush: a Python lookup beats the kernels' fixed cost
            return pa.array(self.interner.lookup(codes.tolist()), pa.string())
        # hash-encode the codes in C++, then look up only the distinct ones in Python
        null = codes == INT_NULL
        encoded = pa.array(codes, pa.int64(), mask=null if null.any() else None).dictionary_encode()
        names = self.interner.lookup(encoded.dictionary.to_numpy())
        return pa.array(names, pa.string()).take(encoded.indices)


class RowSink(Sink):
    """Rows kept as Python tuples: for low-rate tables with float columns."""

    def __init__(self, table: Table, max_pending_rows: int) -> None:
        super().__init__(table, max_pending_rows)
        self.rows: list[tuple[Any, ...]] = []
        #: the C packer's column kinds, and the struct ArrowArray it fills (flusher thread only)
        self._kinds = _c_kinds(table)
        self._c_array = ctypes.create_string_buffer(_ARROW_ARRAY_SIZE)

    def pending(self) -> int:
        return len(self.rows) + self._pending_batch_rows() + self._feed_rows()

    def append(self, values: Sequence[Any]) -> None:
        if len(self.rows) >= self.max_pending_rows:
            self.dropped += 1
            return
        if len(values) != len(self.table.columns):
            raise ValueError(f"{self.table.name}: expected {len(self.table.columns)} values, got {len(values)}")
        self.rows.append(tuple(values))

    def _drain_rows(self) -> pa.RecordBatch | None:
        n = len(self.rows)
        if n == 0:
            return None
        rows = self.rows[:n]
        del self.rows[:n]
        if _cpack is not None and self._kinds is not None and n <= CPACK_MAX_ROWS:
            address = ctypes.addressof(self._c_array)
            batch = _import_packed(address, self.schema, _cpack.pack_tuples, rows, self._kinds, address)
            if batch is not None:
                return batch
        arrays = []
        for j, col in enumerate(self.table.columns):
            values = [r[j] for r in rows]
            try:
                arrays.append(pa.array(values, col.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
                # one bad value must not lose the batch: keep what converts
                arrays.append(pa.array([_coerce(v, col.kind) for v in values], col.type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


#: sizeof(struct ArrowArray) of the Arrow C data interface
_ARROW_ARRAY_SIZE = 80


def _c_kinds(table: Table) -> bytes | None:
    """The C packer's kind of each column (``l`` int64, ``i`` int32, ``s`` string, ``d`` float64),
    or None when a column has a type it does not build."""
    kinds = []
    for c in table.columns:
        if c.kind == "string":
            kinds.append("s")
        elif c.kind == "float" and c.type == pa.float64():
            kinds.append("d")
        elif c.kind == "int" and c.type.bit_width in (32, 64):
            kinds.append("l" if c.type.bit_width == 64 else "i")
        else:
            return None
    return "".join(kinds).encode()


def _import_packed(address: int, schema: pa.Schema, pack: Callable[..., int], *args: Any) -> pa.RecordBatch | None:
    """``pack(*args)`` fills the struct ArrowArray at ``address``; the batch pyarrow imports from
    it, or None when the packer gave up (the Python path then converts those rows)."""
    try:
        pack(*args)
    except Exception:
        return None
    try:
        return pa.RecordBatch._import_from_c(address, schema)
    except Exception:
        _cpack.release(address)
        return None


def _coerce(v: Any, kind: str) -> Any:
    try:
        if v is None:
            return None
        if kind == "int":
            return int(v)
        if kind == "float":
            return float(v)
        return str(v)
    except (TypeError, ValueError, OverflowError):
        return None


_INT_RANGES = {bits: (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) for bits in (8, 16, 32, 64)}
_NP_INTS = {8: np.int8, 16: np.int16, 32: np.int32}
#: String columns of at most this many rows are looked up row by row (see PackedSink._strings).
SMALL_STRING_ROWS = 512
#: The longest the flusher sleeps while no table has rows pending (see TraceWriter._next_wait).
QUIET_WAIT_S = 1.0


def _int_array(values: np.ndarray, type_: pa.DataType, null: np.ndarray | None) -> pa.Array:
    """An Arrow integer array over contiguous int64 ``values`` (``null``: where INT_NULL is, or
    None when nowhere), built from its buffers: ``pa.array`` on a numpy array costs a few µs
    more per call in checks, and a live flush makes dozens of these calls for a few rows."""
    if type_.bit_width != 64:
        lo, hi = _INT_RANGES[type_.bit_width]
        # a value that does not fit becomes null, not a wrapped number; narrowed in numpy (an
        # Arrow cast kernel costs ~50 µs per call even on a few rows)
        out_of_range = (values < lo) | (values > hi)
        if out_of_range.any():
            null = out_of_range if null is None else null | out_of_range
        values = values.astype(_NP_INTS[type_.bit_width])
    if null is None:
        return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(values)], null_count=0)
    valid = pa.py_buffer(np.packbits(~null, bitorder="little"))
    return pa.Array.from_buffers(type_, len(values), [valid, pa.py_buffer(values)],
                                 null_count=int(null.sum()))


def _warm_up() -> None:
    """Run the Arrow kernels the flusher uses once, at set-up: their first call
    initialises state for a few hundred ms while holding the GIL, which must not
    land in the middle of the host's loop."""
    codes = np.array([1, INT_NULL], dtype=np.int64)
    enc = pa.array(codes, pa.int64(), mask=codes == INT_NULL).dictionary_encode()
    pa.array(["x"], pa.string()).take(enc.indices)
    pa.array(codes, pa.int64()).cast(pa.int32(), safe=False)
    pc.less(pa.array([1]), 0)


def conform_batch(table: Table, data: Mapping[str, Any] | pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    """Build a record batch in the table's canonical schema from column data."""
    if isinstance(data, (pa.RecordBatch, pa.Table)):
        cols = {name: data.column(name) for name in data.schema.names}
    else:
        cols = dict(data)
    lengths = {len(v) for v in cols.values()}
    if len(lengths) > 1:
        raise ValueError(f"{table.name}: columns have different lengths {sorted(lengths)}")
    n = lengths.pop() if lengths else 0
    arrays = []
    for col in table.columns:
        v = cols.get(col.name)
        if v is None:
            if col.required:
                raise ValueError(f"{table.name}: required column {col.name} missing")
            arrays.append(pa.nulls(n, col.type))
            continue
        if isinstance(v, pa.ChunkedArray):
            v = v.combine_chunks()
        arr = v if isinstance(v, pa.Array) else pa.array(v)
        if arr.type != col.type:
            arr = arr.cast(col.type)
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, schema=table.arrow_schema)


class _Parts:
    """A write-only file object that keeps what Arrow writes, so each IPC message
    can go to disk in one ``os.write``."""

    closed = False

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: Any) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


#: Batches with fewer rows are written uncompressed: LZ4 frames cost ~100 µs per batch whatever
#: its size (one frame per buffer), which is most of a small flush's cost (a live recording
#: flushes ten times a second) and saves a few KB. Larger batches compress (smaller and faster
#: to write). Compression is per batch in the IPC format, so a stream may mix both.
COMPRESS_MIN_ROWS = 1024
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


class _BatchEncoder:
    """Encodes record batches as IPC messages (no schema message) with one compression setting."""

    def __init__(self, schema: pa.Schema, head: bytes, compression: str | None) -> None:
        self._parts = _Parts()
        self._head = head
        self._first = True
        options = pa.ipc.IpcWriteOptions(compression=compression)
        self._writer = pa.ipc.new_stream(pa.PythonFile(self._parts, mode="w"), schema, options=options)

    def encode(self, batch: pa.RecordBatch) -> bytes:
        self._writer.write_batch(batch)
        data = self._parts.take()
        if self._first:  # the schema message is written once, by the file
            self._first = False
            if not data.startswith(self._head):
                raise ValueError("unexpected IPC schema message")
            data = data[len(self._head):]
        return data


class _StreamFile:
    """One Arrow IPC stream file being appended to, one complete message per write.

    The schema message is written when the file is created, so even a killed
    process leaves a readable (empty) table; each batch is then one ``os.write``.
    """

    def __init__(self, path: Path, schema: pa.Schema, compression: str | None) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.bytes = 0
        self.schema = schema
        self.compression = compression
        self._head = schema.serialize().to_pybytes()
        self._encoders: dict[str | None, _BatchEncoder] = {}
        try:
            self._write(self._head)
        except OSError:
            os.close(self.fd)
            raise

    def _write(self, data: bytes | pa.Buffer) -> None:
        start = self.bytes
        view = memoryview(data)
        try:
            while view:
                n = os.write(self.fd, view)
                view = view[n:]
                self.bytes += n
        except OSError:
            # A full disk or a file-size limit can cut a message in the middle: cut the file
            # back to the last whole message, so what was written stays a valid stream.
            try:
                os.ftruncate(self.fd, start)
                self.bytes = start
            except OSError:
                pass
            raise

    def abandon(self) -> None:
        """Close without writing more (the writer stopped): the file ends at its last whole message."""
        os.close(self.fd)

    def write_batch(self, batch: pa.RecordBatch) -> None:
        comp = self.compression if batch.num_rows >= COMPRESS_MIN_ROWS else None
        if comp is None:
            # an uncompressed batch's stream message is what serialize() gives (one call, ~3 µs,
            # against ~12 µs through a stream writer and a Python file; tests/unit/test_cpack.py
            # checks the bytes are the same)
            self._write(batch.serialize())
            return
        enc = self._encoders.get(comp)
        if enc is None:
            enc = self._encoders[comp] = _BatchEncoder(self.schema, self._head, comp)
        self._write(enc.encode(batch))

    def close(self, fsync: bool = True) -> None:
        try:
            self._write(_EOS)  # the end-of-stream marker
            if fsync:
                os.fsync(self.fd)
        finally:
            os.close(self.fd)


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
    """

    def __init__(self, directory: str | os.PathLike[str], *, meta: Mapping[str, Any] | None = None,
                 flush_rows: int = 65536, flush_interval_s: float = 1.0,
                 max_pending_rows: int = 2_000_000, segment_bytes: int = 256 << 20,
                 declare: Iterable[str] = (), compression: str | None = "lz4") -> None:
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
        self._files: dict[str, _StreamFile] = {}
        self._segments: dict[str, int] = {}
        self._sink_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
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
                if p.suffix in (".arrows", ".arrow", ".parquet") and p.is_file():
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
        while not self._stop.wait(self._next_wait()):
            with self._flush_lock:
                if not self._closed:
                    self._flush_all(force=False)

    def _next_wait(self) -> float:
        """Sleep until the first table with rows pending is due, or until rows arriving at their
        present rate would reach ``flush_rows``, and at most
        :data:`QUIET_WAIT_S` when nothing is pending (the first rows after a quiet spell are due
        at once: they wait for the next look-in).

        Every wake-up costs the process CPU even when there is nothing to do: tens of µs on a
        cold cache, ~80 µs on the 2-vCPU VM of benchmarks/RESULTS.md. A fixed 0.1 s poll woke an
        idle file recording ten times a second (1.9 ms of CPU per second, more than the rows it
        wrote cost); a live recording (0.1 s interval) still wakes ten times a second to flush."""
        interval = self.flush_interval_s
        wait = min(QUIET_WAIT_S, interval)
        now = time.monotonic()
        for sink in list(self._sinks.values()):
            pending = sink.pending()
            rate, sink.rate = sink.rate, 0.0  # the last flush's rate: used once, just after it
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
        now = time.monotonic()
        wrote = False
        sinks = list(self._sinks.items())
        # One table due drains them all: the interner forgets a retired string two
        # collects later, which is only safe if every collect follows a drain of every
        # table (else a row still waiting in a slower table loses its request id).
        force = force or any(
            (p := sink.pending()) and (p >= self.flush_rows or now - sink.last_flush >= self.flush_interval_s)
            for _, sink in sinks)
        for name, sink in sinks:
            if not force or not (pending := sink.pending()):
                continue
            sink.rate = pending / max(now - sink.last_flush, 1e-3)
            sink.last_flush = now
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

    def _open_file(self, name: str) -> _StreamFile:
        seg = self._segments.get(name, 0)
        fname = table_file_name(name, "arrows", f"{seg:06d}" if seg else None)
        f = _StreamFile(self.directory / fname, TABLES[name].arrow_schema, self.compression)
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
