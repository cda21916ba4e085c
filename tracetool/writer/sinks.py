"""Where the rows of one table wait for the flusher, and how they become Arrow record batches.

Two buffers, one conversion each:

* :class:`PackedSink` — tables whose columns are all integers or strings
  (spans, tokens, steps, stacks, requests, clock offsets). A row is appended
  with one ``struct.pack`` + ``array.frombytes``: a single C call, so rows
  from several threads never interleave, and a bad value fails before
  anything is appended. Strings travel as codes of a shared
  :class:`~tracetool.writer.interner.Interner`; a null travels as
  :data:`tracetool.schema.INT_NULL`. The flusher turns the buffer into
  columns with numpy; the only per-value Python work is the string lookup of
  a small flush (:meth:`PackedSink.strings`).
* :class:`RowSink` — tables with float columns (gpu): low-rate, kept as Python
  tuples, converted one ``pa.array`` per column.

Both also take whole batches (:meth:`Sink.append_batch`) and *feeds*
(:meth:`Sink.tuple_feed`): a list a hot path appends raw tuples of its own
shape to, converted on the flusher thread.
"""

from __future__ import annotations

import array
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from tracetool.schema import INT_NULL, Table
from tracetool.writer.interner import Interner

#: String columns of at most this many rows are looked up row by row (see PackedSink.strings).
SMALL_STRING_ROWS = 512
#: A larger string column is built run by run when its codes change at most once every this many
#: rows (see PackedSink.strings).
RUN_ROWS = 8
_INT_RANGES = {bits: (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) for bits in (8, 16, 32, 64)}
_NP_INTS = {8: np.int8, 16: np.int16, 32: np.int32}


class Sink:
    """Where the rows of one table wait for the flusher. Subclasses pick the buffer."""

    def __init__(self, table: Table, max_pending_rows: int) -> None:
        self.table = table
        self.schema = table.arrow_schema
        self.max_pending_rows = max_pending_rows
        #: rows refused because ``max_pending_rows`` were waiting (or the writer had stopped)
        self.dropped = 0
        self.rows_written = 0
        #: ``time.monotonic()`` of the last drain
        self.last_flush = time.monotonic()
        self._rate = 0.0  # rows per second up to the last drain (see take_rate)
        self._batches: list[pa.RecordBatch] = []
        self._feeds: list[tuple[list[Any], Callable[[list[Any]], Mapping[str, Any]]]] = []
        self._ended: list[list[Any]] = []  # feeds ended since the last drain
        self._retiring: list[list[Any]] = []  # ended before it: forgotten at this drain when empty

    # -- producer side --------------------------------------------------------------------
    def append(self, values: Sequence[Any]) -> None:
        """Append one row given as plain values in the table's column order (None = null).

        Trailing optional columns may be left out (they are null): a v1 table that gains an
        optional column keeps taking the rows its writers appended before."""
        raise NotImplementedError

    def _complete(self, values: Sequence[Any]) -> Sequence[Any]:
        """``values`` padded with nulls for the trailing optional columns it leaves out; too many
        values, or a required column left out, is a ValueError in the caller."""
        cols = self.table.columns
        n = len(values)
        if n > len(cols) or any(c.required for c in cols[n:]):
            raise ValueError(f"{self.table.name}: expected {len(cols)} values, got {n}")
        return (*values, *([None] * (len(cols) - n)))

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

    def tuple_feed(self, convert: Callable[[list[Any]], Mapping[str, Any]]) -> list[Any]:
        """A list a hot path appends raw tuples of its own shape to, converted off that path.

        The producer checks ``len(feed) < sink.max_pending_rows`` (else counts
        ``sink.dropped``) and appends; the flusher takes what is there and
        ``convert(tuples)`` gives the table's columns (a mapping as
        :meth:`append_batch` takes), vectorised. ``list.append`` is the
        cheapest hand-off a Python hot path has, and it is atomic under the GIL.
        """
        feed: list[Any] = []
        self._feeds = [*self._feeds, (feed, convert)]  # a new list: the flusher may be iterating
        return feed

    def end_feed(self, feed: list[Any]) -> None:
        """The producer of ``feed`` is done (an instrumented model removed): the flusher keeps
        draining it for two more drains, for a step that was in flight, then forgets it, so
        that a server instrumenting model after model does not keep a list per model."""
        self._ended = [*self._ended, feed]

    # -- flusher side ---------------------------------------------------------------------
    def pending(self) -> int:
        """Rows waiting, in every buffer of this sink."""
        return self._buffered_rows() + self._pending_batch_rows() + sum(len(f) for f, _ in self._feeds)

    def mark_flushed(self, now: float) -> None:
        """Note a drain at ``now`` (monotonic seconds): the rate the pending rows came in at."""
        self._rate = self.pending() / max(now - self.last_flush, 1e-3)
        self.last_flush = now

    def take_rate(self) -> float:
        """Rows per second up to the last drain, once (then 0 until the next drain): the flusher
        uses it to guess when ``flush_rows`` will be reached, just after a drain."""
        rate, self._rate = self._rate, 0.0
        return rate

    def drain(self) -> list[pa.RecordBatch]:
        """Take what is pending as record batches (flusher thread only)."""
        out: list[pa.RecordBatch] = []
        n = len(self._batches)
        if n:
            out.extend(self._batches[:n])
            del self._batches[:n]
        for feed, convert in self._feeds:
            if feed:
                batch = conform_batch(self.table, convert(_take_list(feed)))
                if batch.num_rows:
                    out.append(batch)
        if self._retiring or self._ended:
            gone = {id(f) for f in self._retiring if not f}
            if gone:
                self._feeds = [(f, c) for f, c in self._feeds if id(f) not in gone]
            ended, self._ended = self._ended, []
            self._retiring = [f for f in self._retiring if id(f) not in gone] + ended
        rows = self._drain_rows()
        if rows is not None and rows.num_rows:
            out.append(rows)
        return out

    def _buffered_rows(self) -> int:
        raise NotImplementedError

    def _drain_rows(self) -> pa.RecordBatch | None:
        raise NotImplementedError

    def _pending_batch_rows(self) -> int:
        return sum(b.num_rows for b in list(self._batches))


def _take_list(feed: list[Any]) -> list[Any]:
    n = len(feed)
    chunk = feed[:n]
    del feed[:n]  # tuples appended meanwhile stay for the next drain (each list op is atomic)
    return chunk


class PackedSink(Sink):
    """Rows of int64s (strings as interner codes) packed into one ``array('q')``.

    Hot paths outside the writer (the Recorder's token and span paths) append
    ``buf.frombytes(pack(...))`` themselves after checking :meth:`full`; these
    four attributes are the public contract for that.
    """

    def __init__(self, table: Table, max_pending_rows: int, interner: Interner) -> None:
        super().__init__(table, max_pending_rows)
        #: the interner the string columns' codes come from (shared by every packed sink of a writer)
        self.interner = interner
        self.ncols = len(table.columns)
        #: the pending rows, ``ncols`` int64s each
        self.buf = array.array("q")
        #: ``pack(*ints)`` gives the bytes of one row
        self.pack = struct.Struct(f"={self.ncols}q").pack
        #: ``len(buf)`` at which the sink is full
        self.max_items = max_pending_rows * self.ncols
        self._is_str = [c.kind == "string" for c in table.columns]

    def full(self) -> bool:
        return len(self.buf) >= self.max_items

    def append(self, values: Sequence[Any]) -> None:
        if len(self.buf) >= self.max_items:
            self.dropped += 1
            return
        if len(values) != self.ncols:
            values = self._complete(values)
        code = self.interner.code
        ints = [
            INT_NULL if v is None else (code(str(v)) if is_str else int(v))
            for v, is_str in zip(values, self._is_str, strict=True)
        ]
        self.buf.frombytes(self.pack(*ints))

    def _buffered_rows(self) -> int:
        return len(self.buf) // self.ncols

    def _drain_rows(self) -> pa.RecordBatch | None:
        n = len(self.buf) // self.ncols * self.ncols
        if n == 0:
            return None
        chunk = self.buf[:n]
        del self.buf[:n]
        return self.to_batch(chunk)

    def to_batch(self, chunk: array.array[int]) -> pa.RecordBatch:
        """Packed rows (``ncols`` int64s each) as one record batch of the table's schema."""
        rows = np.frombuffer(chunk, dtype=np.int64).reshape(-1, self.ncols)
        # blocked transpose: one cache-friendly pass instead of a strided pass per column
        cols = np.empty((self.ncols, len(rows)), dtype=np.int64)
        for a in range(0, len(rows), 4096):
            cols[:, a:a + 4096] = rows[a:a + 4096].T
        # the null checks of every column in three numpy calls, not three per column
        null = cols == INT_NULL
        any_null = null.any(axis=1).tolist()
        all_null = null.all(axis=1).tolist()
        arrays = []
        for j, col in enumerate(self.table.columns):
            if all_null[j]:
                arrays.append(pa.nulls(len(rows), col.type))
            elif self._is_str[j]:
                arrays.append(self.strings(cols[j], null[j] if any_null[j] else None))
            else:
                arrays.append(int_array(cols[j], col.type, null[j] if any_null[j] else None))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def strings(self, codes: np.ndarray, null: np.ndarray | None) -> pa.Array:
        """A string column from interner codes; a code the interner already forgot becomes null.

        The lookup is in Python, so its cost follows the rows: a flush of up to
        :data:`SMALL_STRING_ROWS` rows (a live or low-rate recording's) looks each row up. A
        larger one whose codes come in runs (a request's tokens, one after another) looks up one
        string per run and builds the column from its buffers; any other hash-encodes the codes
        in Arrow and looks up only the distinct ones, then gathers. Arrow's kernels cost more to
        enter than a few dozen lookups, the more so with cold caches between flushes: on the
        flusher thread inside a real decode loop, a small flush's string column cost about ten
        times more through them, and a 1,000-token flush's 0.6 ms through the hash (0.6 µs a
        decode step at a 1 ms step)."""
        n = len(codes)
        if n <= SMALL_STRING_ROWS:
            return pa.array(self.interner.lookup(codes.tolist()), pa.string())
        starts = np.flatnonzero(codes[1:] != codes[:-1]) + 1
        if len(starts) * RUN_ROWS < n:
            column = self._runs(codes, starts)
            if column is not None:
                return column
        encoded = pa.array(codes, pa.int64(), mask=null).dictionary_encode()
        names = self.interner.lookup(encoded.dictionary.to_numpy())
        return pa.array(names, pa.string()).take(encoded.indices)

    def _runs(self, codes: np.ndarray, starts: np.ndarray) -> pa.Array | None:
        """The string column of codes that come in runs, from its buffers (one lookup and one
        ``bytes`` repeat per run); None when a run has no string (a null or forgotten code)."""
        bounds = np.concatenate(([0], starts, [len(codes)]))
        names = self.interner.lookup(codes[bounds[:-1]].tolist())
        if any(name is None for name in names):
            return None
        encoded = [name.encode() for name in names]  # type: ignore[union-attr]
        runs = np.diff(bounds)
        data = b"".join(e * k for e, k in zip(encoded, runs.tolist(), strict=True))
        if len(data) >= 1 << 31:
            return None
        offsets = np.zeros(len(codes) + 1, np.int32)
        np.cumsum(np.repeat(np.array([len(e) for e in encoded], np.int32), runs), out=offsets[1:])
        return pa.StringArray.from_buffers(len(codes), pa.py_buffer(offsets), pa.py_buffer(data))


class RowSink(Sink):
    """Rows kept as Python tuples: for low-rate tables with float columns."""

    def __init__(self, table: Table, max_pending_rows: int) -> None:
        super().__init__(table, max_pending_rows)
        self.rows: list[tuple[Any, ...]] = []

    def append(self, values: Sequence[Any]) -> None:
        if len(self.rows) >= self.max_pending_rows:
            self.dropped += 1
            return
        if len(values) != len(self.table.columns):
            values = self._complete(values)
        self.rows.append(tuple(values))

    def _buffered_rows(self) -> int:
        return len(self.rows)

    def _drain_rows(self) -> pa.RecordBatch | None:
        n = len(self.rows)
        if n == 0:
            return None
        rows = self.rows[:n]
        del self.rows[:n]
        arrays = []
        for j, col in enumerate(self.table.columns):
            values = [r[j] for r in rows]
            try:
                arrays.append(pa.array(values, col.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
                # one bad value must not lose the batch: keep what converts
                arrays.append(pa.array([_coerce(v, col.kind) for v in values], col.type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


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


def int_array(values: np.ndarray, type_: pa.DataType, null: np.ndarray | None = None) -> pa.Array:
    """An Arrow integer array over contiguous int64 ``values`` (``null``: where INT_NULL is, or
    None when nowhere), built from its buffers (public ``Array.from_buffers``): a live flush makes
    dozens of these calls for a few rows, and ``pa.array`` on numpy adds checks to each."""
    if type_.bit_width != 64:
        lo, hi = _INT_RANGES[type_.bit_width]
        # a value that does not fit becomes null, not a wrapped number; narrowed in numpy
        out_of_range = (values < lo) | (values > hi)
        if out_of_range.any():
            null = out_of_range if null is None else null | out_of_range
        values = values.astype(_NP_INTS[type_.bit_width])
    if null is None:
        return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(values)], null_count=0)
    valid = pa.py_buffer(np.packbits(~null, bitorder="little"))
    return pa.Array.from_buffers(type_, len(values), [valid, pa.py_buffer(values)],
                                 null_count=int(null.sum()))


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
