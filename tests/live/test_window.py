"""The sliding window: which rows a live view holds (whole requests, by time or count)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tracetool.live import window
from tracetool.live.window import ServerWindow, WindowSpec
from tracetool.schema import TABLES

S = 1_000_000_000  # ns per second


def _batch(table: str, rows: list[dict]) -> pa.RecordBatch:
    schema = TABLES[table].arrow_schema
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def _request(w: ServerWindow, rid: str, start_s: float, end_s: float, tokens: int = 3) -> None:
    """One request on the server clock: a server.request span and tokens spread inside it."""
    a, b = int(start_s * S), int(end_s * S)
    w.add("spans", _batch("spans", [{"request_id": rid, "name": "server.request", "start_ns": a,
                                     "end_ns": b, "clock": "server"}]))
    step = (b - a) // (tokens + 1)
    w.add("tokens", _batch("tokens", [{"request_id": rid, "index": i, "emit_ns": a + (i + 1) * step}
                                      for i in range(tokens)]))
    w.add("requests", _batch("requests", [{"request_id": rid, "prompt_tokens": 4, "output_tokens": tokens,
                                           "status": "ok"}]))


def _ids(trace, table: str = "tokens") -> set[str]:
    return set(trace.table(table).column("request_id").to_pylist())


def test_time_window_keeps_whole_recent_requests() -> None:
    w = ServerWindow("10.0.0.5:9000", WindowSpec(seconds=10))
    w.set_hello({"meta": {"model": {"name": "m"}}, "tables": ["spans", "tokens", "requests", "steps"]}, True)
    _request(w, "old", 1000, 1005)    # ended 95 s before the newest: out
    _request(w, "long", 1080, 1095)   # started before the cut-off, active within it: in, whole
    _request(w, "new", 1096, 1100)
    w.add("steps", _batch("steps", [{"step_id": 1, "start_ns": 1000 * S, "end_ns": 1000 * S + 1, "batch_size": 1,
                                     "prefill_tokens": 0, "decode_tokens": 1, "kv_tokens": 1},
                                    {"step_id": 2, "start_ns": 1099 * S, "end_ns": 1099 * S + 1, "batch_size": 1,
                                     "prefill_tokens": 0, "decode_tokens": 1, "kv_tokens": 1}]))
    t = w.trace()
    assert t is not None and t.name == "10.0.0.5:9000"
    assert _ids(t) == _ids(t, "spans") == _ids(t, "requests") == {"long", "new"}
    assert t.rows("tokens") == 6, "every token of a request in the window, also those before the cut-off"
    assert t.table("steps").column("step_id").to_pylist() == [2], "rows without a request: by time"
    assert t.meta["model"] == {"name": "m"} and t.meta["closed"] is True
    assert any("live window (last 10 s)" in n for n in t.meta["notes"])
    assert t.has("steps") and t.rows("gpu") == 0 and not t.has("gpu")


def test_request_window_keeps_the_latest_started() -> None:
    w = ServerWindow("a:1", WindowSpec(seconds=None, requests=2))
    for k in range(5):
        _request(w, f"r{k}", 100 + k, 100 + k + 0.5)
    t = w.trace()
    assert t is not None and _ids(t) == {"r3", "r4"}
    w.set_spec(WindowSpec(seconds=None, requests=10))
    assert _ids(w.trace()) == {f"r{k}" for k in range(5)}


def test_window_slides_with_elapsed_time_without_clock_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(window.time, "monotonic", lambda: clock[0])
    w = ServerWindow("a:1", WindowSpec(seconds=10))
    _request(w, "only", 5, 5.1)  # the server's clock is at 5.1 s: nowhere near this machine's
    assert _ids(w.trace()) == {"only"}
    clock[0] += 9.0  # the window is defined by local time elapsed since the newest row arrived
    assert _ids(w.trace()) == {"only"}
    clock[0] += 2.0
    assert w.trace() is None, "a quiet server's window empties out"


def test_drops_are_merged_into_the_meta_and_rates_counted() -> None:
    w = ServerWindow("a:1")
    w.set_hello({"meta": {"dropped_rows": {"tokens": 2}}, "tables": []}, True)
    _request(w, "x", 1, 2, tokens=5)
    w.dropped = {"tokens": 40}
    t = w.trace()
    assert t.meta["dropped_rows"] == {"tokens": 42}
    assert w.tokens_total == 5 and w.tokens_per_s() > 0


def test_rows_a_server_sends_outside_the_row_rules_are_dropped_and_counted() -> None:
    """Found by the live-stream fuzz campaign: a server streaming tokens under a schema whose
    required columns are nullable, one row with a null index, made the viewer's snapshot raise
    (the window's trace could not take the table's schema)."""
    w = ServerWindow("a:1")
    _request(w, "x", 1, 2, tokens=2)
    loose = pa.schema([f.with_nullable(True) for f in TABLES["tokens"].arrow_schema])
    w.add("tokens", pa.RecordBatch.from_pylist([{"request_id": "x", "index": None, "emit_ns": S + 5},
                                                {"request_id": "x", "index": 2, "emit_ns": S + 9}],
                                               schema=loose))
    t = w.trace()
    assert t is not None
    tokens = t.table("tokens")
    assert tokens.schema == TABLES["tokens"].arrow_schema
    assert sorted(tokens.column("index").to_pylist()) == [0, 1, 2]
    assert t.meta["dropped_rows"] == {"tokens": 1}
    tokens.validate(full=True)


def test_empty_and_request_less_windows_give_nothing() -> None:
    w = ServerWindow("a:1")
    assert w.trace() is None
    w.add("gpu", _batch("gpu", [{"ts_ns": 1, "gpu": 0}]))
    assert w.trace() is None, "no request in the window: nothing to analyse yet"


def test_retention_is_bounded_in_rows() -> None:
    w = ServerWindow("a:1", WindowSpec(seconds=None, max_rows=10))
    for k in range(10):
        _request(w, f"r{k}", k, k + 0.5, tokens=3)
    t = w.trace()
    assert t.rows("tokens") <= 10 + 3
