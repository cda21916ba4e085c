"""The sliding window of one live server: what a viewer analyses now.

Batches arrive on reader threads (:meth:`ServerWindow.add`) and are kept, by
reference, for ``seconds + retain_s`` of the server's clock (at most
``max_rows`` rows per table). Per request the first and last timestamp seen
are tracked as batches arrive (one grouped aggregate per batch), so taking a
window (:meth:`ServerWindow.trace`) is a dictionary scan plus one Arrow
filter per table, not a pass over history in Python.

Which rows a window holds:

* a **request** is in the window when its last activity (span end, token
  emit) is within the last ``seconds`` of the server's clock, and — with
  ``requests=N`` — it is among the N most recently started of those;
  every retained row of a request in the window is kept (its spans and
  tokens from before the cut-off too), so the analyzers see whole requests;
* rows without a request (GPU and CPU samples, engine steps, rows with an
  empty ``request_id``) are kept when their time is within the window (from
  the earliest start of the requests kept, with ``requests=N`` alone).

"Now" on the server's clock is the newest timestamp received plus the time
elapsed locally since it arrived: no clock synchronisation between viewer and
server is needed, and a server that goes quiet sees its window empty out.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracetool.conform import broken_rows
from tracetool.reader import Trace
from tracetool.schema import TABLES

#: The column that dates a row of each table (None or absent: joined by request id only).
TIME_COLUMN: dict[str, str | None] = {"spans": "end_ns", "tokens": "emit_ns", "gpu": "ts_ns",
                                      "stacks": "ts_ns", "steps": "end_ns", "requests": None,
                                      "server_metrics": "ts_ns"}
#: The column a request starts at, per table (for "most recently started").
START_COLUMN = {"spans": "start_ns", "tokens": "emit_ns"}


@dataclass(frozen=True)
class WindowSpec:
    """What a live view covers (``tracetool attach --window-s/--window-requests``).

    Attributes:
        seconds: last N seconds of the server's clock; None for no time limit.
        requests: the N most recently started requests (within ``seconds`` when both); None for all.
        retain_s: history kept beyond ``seconds`` (whole requests that started before the cut-off).
        max_rows: rows kept per table at most, oldest batches out first (bounds memory when
            ``seconds`` is None).
    """

    seconds: float | None = 30.0
    requests: int | None = None
    retain_s: float = 60.0
    max_rows: int = 2_000_000

    def describe(self) -> str:
        parts = []
        if self.seconds is not None:
            parts.append(f"last {self.seconds:g} s")
        if self.requests is not None:
            parts.append(f"last {self.requests:,} requests")
        return ", ".join(parts) or "everything kept"


@dataclass
class _Chunk:
    batch: pa.RecordBatch
    t_max: int | None


@dataclass
class _Rate:
    """Tokens received per second, over the last couple of seconds (header figure)."""

    window_s: float = 2.0
    marks: deque[tuple[float, int]] = field(default_factory=deque)

    def add(self, n: int, now: float) -> None:
        self.marks.append((now, n))
        self._trim(now)

    def per_s(self, now: float) -> float:
        self._trim(now)
        return sum(n for _, n in self.marks) / self.window_s

    def _trim(self, now: float) -> None:
        while self.marks and self.marks[0][0] < now - self.window_s:
            self.marks.popleft()


class ServerWindow:
    """Everything retained from one server, and the window over it.

    Args:
        label: the view's name (the server's address); it becomes the trace's ``path.name``.
        spec: the window.
    """

    def __init__(self, label: str, spec: WindowSpec | None = None) -> None:
        self.label = label
        self.spec = spec or WindowSpec()
        self.meta: dict[str, Any] = {}
        self.tables: set[str] = set()
        self.tokens_total = 0
        self.rows_total = 0
        self.dropped: dict[str, int] = {}
        self._broken: dict[str, int] = {}  # rows that broke the row rules, dropped here
        self.notes: list[str] = []
        self._lock = threading.Lock()
        self._chunks: dict[str, deque[_Chunk]] = {name: deque() for name in TABLES}
        self._rows: dict[str, int] = dict.fromkeys(TABLES, 0)
        self._requests: dict[str, list[int]] = {}  # request_id -> [first_ns, last_ns]
        self._newest_ns: int | None = None
        self._newest_at = 0.0
        self._rate = _Rate()
        self._version = 0
        self._pruned_at = 0.0

    # -- receiving -----------------------------------------------------------------------------
    def set_hello(self, hello: dict[str, Any], new_instance: bool) -> None:
        """The server said hello: keep its ``meta.json`` and tables (a restart is noted)."""
        with self._lock:
            meta = hello.get("meta")
            if isinstance(meta, dict):
                self.meta = meta
            self.tables |= {t for t in hello.get("tables") or [] if t in TABLES}
            if new_instance and self._version:
                self.notes.append("the server restarted (a new recording) while being watched")

    def add(self, table: str, batch: pa.RecordBatch) -> None:
        """Keep a batch (a reader thread calls this); updates per-request first/last times."""
        if table not in TABLES or batch.num_rows == 0:
            return
        # the window's trace is read as v1 (the TUI analyses it): rows a server sent that break the
        # row rules are dropped and counted, and the rest take the table's schema (nullability too)
        keep = valid_rows(table, batch)
        if keep is not None:
            bad = batch.num_rows - int(pc.sum(pc.cast(keep, pa.int64())).as_py() or 0)
            with self._lock:
                self._broken[table] = self._broken.get(table, 0) + bad
            batch = batch.filter(keep)
            if batch.num_rows == 0:
                return
        schema = TABLES[table].arrow_schema
        if batch.schema != schema:
            batch = batch.cast(schema)
        now = time.monotonic()
        col = TIME_COLUMN.get(table)
        t_max: int | None = None
        if col is not None:
            t_max = pc.max(batch.column(col)).as_py()
        per_request = _request_times(table, batch)
        with self._lock:
            self.tables.add(table)
            self._chunks[table].append(_Chunk(batch, t_max))
            self._rows[table] += batch.num_rows
            self.rows_total += batch.num_rows
            if table == "tokens":
                self.tokens_total += batch.num_rows
                self._rate.add(batch.num_rows, now)
            for rid, lo, hi in per_request:
                cur = self._requests.get(rid)
                if cur is None:
                    self._requests[rid] = [lo, hi]
                else:
                    cur[0] = min(cur[0], lo)
                    cur[1] = max(cur[1], hi)
            if t_max is not None and (self._newest_ns is None or t_max >= self._newest_ns):
                self._newest_ns, self._newest_at = t_max, now
            self._version += 1
            self._trim()

    def _trim(self) -> None:
        spec = self.spec
        now = self._now_ns()
        keep_from = None if spec.seconds is None or now is None else now - int((spec.seconds + spec.retain_s) * 1e9)
        for name, chunks in self._chunks.items():
            while chunks and (self._rows[name] > spec.max_rows
                              or (keep_from is not None and chunks[0].t_max is not None
                                  and chunks[0].t_max < keep_from)):
                self._rows[name] -= chunks.popleft().batch.num_rows
        # forgetting old requests is a pass over all of them: at most once a second
        if time.monotonic() - self._pruned_at < 1.0:
            return
        self._pruned_at = time.monotonic()
        if keep_from is not None:
            self._requests = {k: v for k, v in self._requests.items() if v[1] >= keep_from}
        elif spec.requests is not None and len(self._requests) > 4 * spec.requests + 1000:
            newest = sorted(self._requests.items(), key=lambda kv: kv[1][0])[-2 * spec.requests:]
            self._requests = dict(newest)

    def _now_ns(self) -> int | None:
        if self._newest_ns is None:
            return None
        return self._newest_ns + int((time.monotonic() - self._newest_at) * 1e9)

    # -- reading -------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Increases with every batch received (a viewer may skip work when it did not move)."""
        return self._version

    def tokens_per_s(self) -> float:
        with self._lock:
            return self._rate.per_s(time.monotonic())

    def set_spec(self, spec: WindowSpec) -> None:
        with self._lock:
            self.spec = spec

    def trace(self) -> Trace | None:
        """The window as a :class:`Trace` (None when it holds no request row).

        Its ``meta.json`` is the server's, with ``dropped_rows`` raised by the rows the live
        stream dropped for this viewer, and a note saying it is a live window.
        """
        with self._lock:
            now = self._now_ns()
            if now is None:
                return None
            spec = self.spec
            cutoff = None if spec.seconds is None else now - int(spec.seconds * 1e9)
            reqs = [(v[0], rid) for rid, v in self._requests.items() if cutoff is None or v[1] >= cutoff]
            if spec.requests is not None:
                reqs = sorted(reqs)[-spec.requests:]
                start = reqs[0][0] if reqs else now
                cutoff = start if cutoff is None else max(cutoff, start)
            batches = {name: [c.batch for c in chunks] for name, chunks in self._chunks.items() if chunks}
            meta = dict(self.meta)
            tables = set(self.tables)
            dropped = dict(self.dropped)
            for k, v in self._broken.items():
                dropped[k] = dropped.get(k, 0) + v
            notes = list(self.notes)
        if not reqs:
            return None
        ids = pa.array([rid for _, rid in reqs], pa.string())
        out: dict[str, pa.Table] = {}
        for name in sorted(tables | set(batches)):
            schema = TABLES[name].arrow_schema
            t = pa.Table.from_batches(batches.get(name, []), schema=schema)
            if t.num_rows:
                t = t.filter(_mask(name, t, ids, cutoff))
            out[name] = t
        if not any(out.get(n) is not None and out[n].num_rows for n in ("spans", "tokens")):
            return None
        merged = dict(meta.get("dropped_rows") or {})
        for k, v in dropped.items():
            merged[k] = int(merged.get(k, 0) or 0) + v
        meta.update(dropped_rows=merged, closed=True,
                    notes=[*(meta.get("notes") or []), f"live window ({spec.describe()}) of {self.label}",
                           *notes])
        return Trace(path=Path(self.label), meta=meta, tables=out)


def _request_times(table: str, batch: pa.RecordBatch) -> list[tuple[str, int, int]]:
    """(request_id, first, last) per request in a batch.

    Dictionary-encode the ids in C++, then a numpy min/max per code: no Python work per
    row, and no Acero (its group_by warns on every batch about Flight's unaligned buffers).
    """
    if table not in START_COLUMN:
        return []
    start, end = START_COLUMN[table], TIME_COLUMN[table]
    assert end is not None
    enc = pc.dictionary_encode(batch.column("request_id"))
    names = enc.dictionary.to_pylist()
    idx = enc.indices.to_numpy(zero_copy_only=False)
    lo = np.full(len(names), np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(len(names), np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(lo, idx, batch.column(start).to_numpy(zero_copy_only=False))
    np.maximum.at(hi, idx, batch.column(end).to_numpy(zero_copy_only=False))
    return [(r, int(a), int(b)) for r, a, b in zip(names, lo, hi, strict=True) if r]


def _mask(table: str, t: pa.Table, ids: pa.Array, cutoff: int | None) -> pa.ChunkedArray:
    col = TIME_COLUMN.get(table)
    recent = None if col is None or cutoff is None else pc.greater_equal(t.column(col), cutoff)
    if "request_id" not in t.schema.names:
        return recent if recent is not None else pc.is_valid(t.column(0))
    rid = t.column("request_id")
    in_window = pc.is_in(rid, value_set=ids)
    if recent is None:
        return in_window
    no_request = pc.equal(rid, "")
    return pc.or_kleene(in_window, pc.and_kleene(no_request, recent))


__all__ = ["TIME_COLUMN", "ServerWindow", "WindowSpec"]


def valid_rows(table: str, batch: pa.RecordBatch) -> pa.Array | None:
    """A mask of the rows that keep the format's row rules (:func:`tracetool.conform.broken_rows`),
    or None when every row does (the common case: no filter, no copy)."""
    spec = TABLES.get(table)
    bad: Any = None
    for _, mask, _ in broken_rows(batch, spec) if spec is not None else ():
        bad = mask if bad is None else pc.or_(bad, mask)
    return None if bad is None else pc.invert(bad)
