"""Every v1 table survives the writer -> files -> reader round trip, values and types intact."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa

from tracetool.reader import open_trace
from tracetool.schema import TABLES
from tracetool.writer import Clock, TraceWriter

ROWS = {
    "spans": [("r1", "server.request", 100, 900, "server"), ("r1", "client.request", 5, 1005, "client"),
              ("r2", "decode", 200, 200, "server")],
    "tokens": [("r1", 0, 300, 12, 250, 300, 1, 7, 0), ("r1", 1, 400, 13, None, None, None, None, None),
               ("r2", 0, 500, None, 450, 500, 4, None, 3)],
    "gpu": [(1_000, 0, 55.5, 20.0, 61.0, 350.5, 1980.0, 2619.0, 80 * 2**30, 97.0, 40.0, 10.0, 0, 1.5e9, 2e8),
            (2_000, 1, None, None, None, None, None, None, None, None, None, None, None, None, None)],
    "stacks": [(10, "MainThread", "tokenize", "main;encode;_bpe", 3), (11, "worker", "idle", "run;wait", 1)],
    "steps": [(0, 100, 200, 4, 512, 0, 512), (1, 200, 260, 4, 0, 4, 2052)],
    "requests": [("r1", 12, 2, "ok", None, 48, 8, None, "engine"),
                 ("r2", None, 1, "error", "boom", None, None, 3, None)],
    "clock_offsets": [("r1", -1_500, 4_000), ("r2", None, None)],
    "otlp_spans": [("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", None, "chatcmpl-1", "llm_request",
                    "server", "vllm", "vllm.llm_engine", 100, 900, "unset", "vllm", '{"gen_ai.latency.e2e": 0.5}'),
                   ("0af7651916cd43dd8448eb211c80319c", "00f067aa0ba902b7", "b7ad6b7169203331", None, "GET /x",
                    None, None, None, 5, 5, None, "none", None)],
    "server_metrics": [(1_000, "vllm:num_requests_waiting", '{"model_name":"m"}', 3.0, "client"),
                       (1_000, "vllm:request_queue_time_seconds_bucket", '{"le":"+Inf"}', 7.0, None)],
}


def test_every_table_round_trips(tmp_path: Path) -> None:
    assert set(ROWS) == set(TABLES), "add rows for every table of the format"
    with TraceWriter(tmp_path, meta={"model": {"name": "m", "layers": 2}}) as w:
        for name, rows in ROWS.items():
            for row in rows:
                w.sink(name).append(row)
    trace = open_trace(tmp_path, strict=True)
    for name, rows in ROWS.items():
        table = trace.table(name)
        assert table.schema == TABLES[name].arrow_schema, name
        got = sorted(repr(tuple(r.values())) for r in table.to_pylist())
        assert got == sorted(repr(tuple(r)) for r in rows), name
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["closed"] is True and meta["model"] == {"name": "m", "layers": 2}
    assert meta["dropped_rows"] == {}


def test_append_batch_and_rows_mix(tmp_path: Path) -> None:
    with TraceWriter(tmp_path) as w:
        s = w.sink("tokens")
        s.append(("a", 0, 10, 5, None, None, None, None, None))
        s.append_batch({"request_id": ["b"] * 3, "index": [0, 1, 2], "emit_ns": [1, 2, 3],
                        "kv_len": pa.array([7, 8, None], pa.int32())})
    t = open_trace(tmp_path).table("tokens")
    assert t.num_rows == 4
    assert sorted(t.column("kv_len").to_pylist(), key=lambda v: (v is None, v)) == [5, 7, 8, None]


def test_rows_may_leave_out_trailing_optional_columns(tmp_path: Path) -> None:
    """A table that gains an optional column keeps taking the rows its writers appended before
    (requests gained cached_prompt_tokens and reasoning_tokens); a required column can't be left out."""
    with TraceWriter(tmp_path) as w:
        w.sink("requests").append(("r1", 5, 3, "ok", None, 20))  # the six columns of before
        w.sink("requests").append(("r2", 5, 3, "ok", None, 20, 4, 1))
        w.sink("gpu").append((1, 0, 50.0))  # a row sink, the optional columns left out
        for bad in [("r3",) + (None,) * 20, ()]:
            try:
                w.sink("requests").append(bad)
            except ValueError as e:
                assert "requests: expected" in str(e)
            else:
                raise AssertionError(f"{bad!r} was taken")
    rows = {r["request_id"]: r for r in open_trace(tmp_path).table("requests").to_pylist()}
    assert set(rows) == {"r1", "r2"}
    assert open_trace(tmp_path).table("gpu").to_pylist()[0]["sm_util_pct"] == 50.0
    assert rows["r1"]["cached_prompt_tokens"] is None and rows["r1"]["prompt_chars"] == 20
    assert rows["r2"]["cached_prompt_tokens"] == 4 and rows["r2"]["reasoning_tokens"] == 1


def test_tuple_feed_rows_are_converted_by_the_flusher(tmp_path: Path) -> None:
    def convert(raws: list[tuple[int, int]]) -> dict[str, list[int]]:
        return {"step_id": [r[0] for r in raws], "start_ns": [r[1] for r in raws],
                "end_ns": [r[1] + 5 for r in raws], "batch_size": [1] * len(raws),
                "prefill_tokens": [0] * len(raws), "decode_tokens": [1] * len(raws),
                "kv_tokens": [r[0] + 10 for r in raws]}

    w = TraceWriter(tmp_path, flush_interval_s=3600, flush_rows=10**9).start()
    s = w.sink("steps")
    feed = s.tuple_feed(convert)
    feed += [(1, 100), (2, 200)]
    assert s.pending() == 2
    w.flush()
    assert s.pending() == 0 and feed == []
    feed.append((3, 300))  # after a drain, the same list keeps feeding
    w.close()
    rows = sorted(open_trace(tmp_path, strict=True).table("steps").to_pylist(), key=lambda r: r["step_id"])
    assert [(r["step_id"], r["end_ns"], r["kv_tokens"]) for r in rows] == [(1, 105, 11), (2, 205, 12), (3, 305, 13)]


def test_an_ended_feed_is_drained_then_forgotten(tmp_path: Path) -> None:
    """A producer that ends its feed (an uninstrumented model) loses no row it appended while
    ending (a step in flight), and the sink does not keep one list per producer for good."""
    def convert(raws: list[tuple[int, int]]) -> dict[str, list[int]]:
        return {"step_id": [r[0] for r in raws], "start_ns": [r[1] for r in raws], "end_ns": [r[1] for r in raws],
                "batch_size": [1] * len(raws), "prefill_tokens": [0] * len(raws),
                "decode_tokens": [1] * len(raws), "kv_tokens": [1] * len(raws)}

    w = TraceWriter(tmp_path, flush_interval_s=3600, flush_rows=10**9).start()
    s = w.sink("steps")
    for i in range(50):
        feed = s.tuple_feed(convert)
        feed.append((2 * i, 1))
        s.end_feed(feed)
        feed.append((2 * i + 1, 2))  # in flight as it ended
        w.flush()
    # a drain forgets what ended two drains before it (a sink with nothing pending is not drained)
    assert len(s._feeds) <= 2, f"{len(s._feeds)} ended feeds are kept"
    w.close()
    rows = open_trace(tmp_path, strict=True).table("steps").column("step_id").to_pylist()
    assert sorted(rows) == list(range(100))


def test_declared_empty_table_means_recorded(tmp_path: Path) -> None:
    with TraceWriter(tmp_path, declare=("spans", "tokens")):
        pass
    trace = open_trace(tmp_path, strict=True)
    assert trace.has("spans") and trace.rows("spans") == 0
    assert not trace.has("gpu"), "a table never written is 'not recorded'"


def test_rotation_into_segments_reads_as_one_table(tmp_path: Path) -> None:
    with TraceWriter(tmp_path, segment_bytes=2_000, flush_rows=50) as w:
        s = w.sink("tokens")
        for i in range(2_000):
            s.append(("r", i, i, i, None, None, None, None, None))
            if i % 100 == 99:
                w.flush()
    files = sorted(p.name for p in tmp_path.glob("tokens*.arrows"))
    assert len(files) > 3 and files[0] == "tokens-000001.arrows" and "tokens.arrows" in files
    t = open_trace(tmp_path, strict=True).table("tokens")
    assert sorted(t.column("index").to_pylist()) == list(range(2_000))


def test_full_buffer_drops_and_counts_without_blocking(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path, max_pending_rows=100, flush_interval_s=3600, flush_rows=10**9).start()
    s = w.sink("tokens")
    for i in range(250):
        s.append(("r", i, i, None, None, None, None, None, None))
    w.close()
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["dropped_rows"] == {"tokens": 150}
    assert open_trace(tmp_path).rows("tokens") == 100


def test_out_of_range_int32_becomes_null_not_wrapped(tmp_path: Path) -> None:
    with TraceWriter(tmp_path) as w:
        w.sink("tokens").append(("r", 0, 1, 2**40, None, None, None, None, None))
    assert open_trace(tmp_path).table("tokens").column("kv_len").to_pylist() == [None]


def test_tables_register_in_duckdb_without_copies(tmp_path: Path) -> None:
    import duckdb

    with TraceWriter(tmp_path) as w:
        for i in range(1000):
            w.sink("tokens").append(("r", i, i * 10, i, None, None, None, None, None))
    trace = open_trace(tmp_path)
    con = duckdb.connect()
    names = trace.register(con)
    assert {"tokens", "spans", "gpu"} <= set(names)
    assert con.execute("select count(*), max(kv_len) from tokens").fetchone() == (1000, 999)
    assert con.execute("select count(*) from gpu").fetchone() == (0,), "unrecorded tables are empty, not missing"


def test_small_batches_uncompressed_large_ones_lz4_in_one_stream(tmp_path: Path) -> None:
    """Small flushes (a live recording's) skip LZ4's per-buffer cost; big ones compress; one stream."""
    from tracetool.writer import COMPRESS_MIN_ROWS

    big = COMPRESS_MIN_ROWS * 4
    with TraceWriter(tmp_path) as w:
        sink = w.sink("tokens")
        for i in range(10):
            sink.append(("small", i, 1_000 + i, i, None, None, 1, None, None))
        w.flush()
        for i in range(big):
            sink.append(("big", i, 5_000 + i, i % 100, None, None, 1, None, None))
        w.flush()
    raw = (tmp_path / "tokens.arrows").read_bytes()
    with pa.ipc.open_stream(raw) as r:
        batches = list(r)
    assert [b.num_rows for b in batches] == [10, big]
    t = open_trace(tmp_path, strict=True).table("tokens")
    assert t.column("index").to_pylist() == list(range(10)) + list(range(big))
    # the big batch went through LZ4: far smaller than its raw buffers
    assert len(raw) < batches[1].nbytes / 2


def test_meta_version_goes_up_with_every_change_the_live_forwarder_must_resend(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path, max_pending_rows=1, flush_interval_s=3600).start()
    seen = [w.meta_version]

    def changed() -> bool:
        seen.append(w.meta_version)
        return seen[-1] > seen[-2]

    w.update_meta(model={"name": "m"})
    assert changed()
    w.note("a note")
    assert changed()
    w.note("a note")  # already there: nothing changed
    assert not changed()
    s = w.sink("tokens")  # a new table is declared
    assert changed()
    s.append(("r", 0, 1, None, None, None, None, None, None))
    s.append(("r", 1, 2, None, None, None, None, None, None))  # over the cap: dropped
    w.flush()  # the drop count reaches meta.json
    assert changed() and w.meta["dropped_rows"] == {"tokens": 1}
    w.flush()
    assert not changed()
    w.close()


class SimClock(Clock):
    """Simulated time for the writer's flusher thread, so that its timing is tested without a
    sleep or a wall-clock assertion: the thread parks in :meth:`wait`; the test moves time on
    with :meth:`run_until`, which wakes it at each deadline it asked for on the way, and returns
    with the thread parked again (so rows the test appends next land while it sleeps)."""

    def __init__(self) -> None:
        self.t = 1_000.0
        self.wakes = 0  # times the flusher woke up on its own (not to stop)
        self._parks = 0
        self._deadline: float | None = None
        self._cv = threading.Condition()

    def now(self) -> float:
        return self.t

    def wait(self, stop: threading.Event, timeout: float) -> bool:
        with self._cv:
            self._parks += 1
            self._deadline = self.t + timeout
            self._cv.notify_all()
            while self.t < self._deadline and not stop.is_set():
                self._cv.wait(0.05)  # to see stop (close() sets it without telling us)
            self._deadline = None
            if not stop.is_set():
                self.wakes += 1
            return stop.is_set()

    def run_until(self, t: float) -> None:
        with self._cv:
            while True:
                assert self._cv.wait_for(lambda: self._deadline is not None, 30), "the flusher never parked"
                deadline = self._deadline
                assert deadline is not None
                if deadline > t:
                    self.t = t
                    return
                parks = self._parks
                self.t = deadline
                self._cv.notify_all()
                assert self._cv.wait_for(lambda p=parks: self._parks > p, 30), "the flusher did not park again"


TOKEN = ("r", 0, 1, None, None, None, None, None, None)


def test_a_live_rate_writer_flushes_on_time_without_polling_between(tmp_path: Path) -> None:
    """The flusher sleeps until a table is due: at a 0.1 s interval every row reaches the file
    within an interval of its append, and the thread wakes about ten times a second (a
    quarter-interval poll woke it forty times)."""
    clock = SimClock()
    w = TraceWriter(tmp_path, flush_interval_s=0.1, clock=clock).start()
    s = w.sink("tokens")
    clock.run_until(clock.t + 0.5)  # settled, idle
    start, wakes = clock.t, clock.wakes
    appended: list[float] = []
    for i in range(20):  # a row every 0.05 s for a second
        s.append(TOKEN)
        appended.append(clock.t)
        clock.run_until(start + (i + 1) * 0.05)
        late = sum(1 for a in appended if a <= clock.t - 0.1 - 0.002)  # older than an interval (+ the 2 ms floor)
        assert s.rows_written >= late, (clock.t - start, s.rows_written, late)
    clock.run_until(start + 1.2)
    woke = clock.wakes - wakes
    w.close()
    assert s.rows_written == 20
    assert woke <= 1.2 * 10 + 2, woke


def test_an_idle_writer_looks_in_about_once_a_second(tmp_path: Path) -> None:
    """Nothing pending: the flusher sleeps up to a second (a 0.1 s poll woke it ten times a
    second, each wake-up costing CPU the host pays); the first rows after the quiet spell still
    reach the file within about a second."""
    clock = SimClock()
    w = TraceWriter(tmp_path, clock=clock).start()  # default interval: 1 s
    clock.run_until(clock.t + 1.2)
    wakes = clock.wakes
    clock.run_until(clock.t + 3.0)
    idle = clock.wakes - wakes
    s = w.sink("tokens")
    s.append(TOKEN)
    t0 = clock.t
    while s.rows_written < 1 and clock.t - t0 < 5:
        clock.run_until(clock.t + 0.01)
    waited = clock.t - t0
    w.close()
    assert idle <= 3, idle
    assert s.rows_written == 1 and waited <= 1.0 + 0.01, waited


def test_rows_arriving_fast_are_flushed_near_flush_rows(tmp_path: Path) -> None:
    """The flusher wakes when rows at their present rate reach flush_rows, not only at the
    interval: at 4,000 rows a second and flush_rows=400 no batch after the first grows far
    past 400 rows, though the interval (10 s) never comes due."""
    import pyarrow.ipc as ipc

    clock = SimClock()
    w = TraceWriter(tmp_path, flush_rows=400, flush_interval_s=10.0, clock=clock).start()
    s = w.sink("tokens")
    start = clock.t
    i = 0
    for k in range(200):  # 40 rows every 10 ms for 2 s
        for _ in range(40):
            s.append(("r", i, 1, None, None, None, None, None, None))
            i += 1
        clock.run_until(start + (k + 1) * 0.01)
    w.close()
    with ipc.open_stream(tmp_path / "tokens.arrows") as r:
        sizes = [b.num_rows for b in r]
    assert sum(sizes) == i
    assert len(sizes) >= i // 400 // 2, sizes
    assert max(sizes[1:-1]) <= 400 * 3, sizes


def test_listeners_hear_each_batch_and_once_per_flush_that_wrote(tmp_path: Path) -> None:
    """The live endpoint's forwarder is woken once per flush (``flushed``), not once per table."""
    batches: list[tuple[str, int]] = []
    flushes: list[int] = []
    with TraceWriter(tmp_path, flush_interval_s=3600) as w:
        w.add_listener(lambda name, b: batches.append((name, b.num_rows)), flushed=lambda: flushes.append(len(batches)))
        w.sink("tokens").append(("r", 0, 1, 2, None, None, None, None, None))
        w.sink("spans").append(("r", "decode", 1, 2, "server"))
        w.sink("steps").append((0, 1, 2, 1, 0, 1, 2))
        w.flush()
        assert sorted(batches) == [("spans", 1), ("steps", 1), ("tokens", 1)]
        assert flushes == [3], "one call after the flush, with every batch already told"
        w.flush()  # nothing pending: no batch, no call
        assert flushes == [3]
