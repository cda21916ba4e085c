"""The System screen's engine rows: requests in flight beside the engine's waiting, running and
KV-cache usage from a scraped /metrics, driven headless with a Pilot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from textual.widgets import Static
from tui_helpers import screen_text, settle, text_of
from tui_traces import _write

from tracetool.tui.engine_view import EngineStrips
from tracetool.tui.screens.system import SystemScreen

MS = 1_000_000
SIZE = (120, 40)
pytestmark = pytest.mark.anyio


def engine_trace(directory: Path) -> Path:
    """Four client requests over one second; the engine scraped every 100 ms: three waiting while
    the first runs, then fewer, KV usage peaking at 90 %."""
    starts = [0, 0, 0, 0]
    ends = [250, 500, 750, 1000]
    spans = pa.table({"request_id": [f"r{i}" for i in range(4)], "name": ["client.request"] * 4,
                      "start_ns": pa.array([s * MS for s in starts], pa.int64()),
                      "end_ns": pa.array([e * MS for e in ends], pa.int64()), "clock": ["client"] * 4})
    ts, names, values = [], [], []
    for k in range(11):
        t = k * 100 * MS
        waiting = max(0, 3 - (k * 100) // 250)
        for name, v in (("vllm:num_requests_waiting", waiting), ("vllm:num_requests_running", 1 if k < 10 else 0),
                        ("vllm:kv_cache_usage_perc", 0.9 if k == 5 else 0.4)):
            ts.append(t)
            names.append(name)
            values.append(float(v))
    metrics = pa.table({"ts_ns": pa.array(ts, pa.int64()), "name": names,
                        "labels": [json.dumps({"model_name": "m"})] * len(ts),
                        "value": pa.array(values, pa.float64()), "clock": ["client"] * len(ts)})
    return _write(directory, {"spans": spans, "server_metrics": metrics}, {})


async def test_system_screen_draws_the_engine_beside_the_requests(tmp_path: Path, make_app: Any) -> None:
    app = make_app(engine_trace(tmp_path / "engine"))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("3")
        await settle(pilot)
        assert isinstance(app.screen, SystemScreen)
        strips = app.screen.query_one(EngineStrips)
        assert strips.display and strips.data is not None
        rows = strips.data.rows
        assert set(rows) == {"in flight", "waiting", "running", "KV usage"}
        assert max(v for v in rows["waiting"] if v is not None) == 3
        assert rows["in flight"][0] == 4  # all four requests start together
        assert max(v for v in rows["KV usage"] if v is not None) == pytest.approx(0.9)
        text = screen_text(app)
        assert "Engine (/metrics)" in text and "vllm · " in text
        assert "waiting     max 3" in text and "KV usage  max 90%" in text


async def test_system_screen_says_how_to_get_engine_metrics(chat: Path, make_app: Any) -> None:
    app = make_app(chat)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("3")
        await settle(pilot)
        assert not app.screen.query_one(EngineStrips).display
        note = app.screen.query_one("#engine-note", Static)
        assert "no server_metrics table" in text_of(note) and "--metrics-url auto" in text_of(note)


async def test_overview_marks_components_filled_from_engine_metrics(tmp_path: Path, make_app: Any) -> None:
    """A client-only trace whose engine exported a queue-time histogram: the waterfall shows the
    engine's window mean for queue, marked as such, not as a measured bar."""
    path = engine_trace(tmp_path / "engine")
    rows = []
    for t, (count, total) in ((0, (0, 0.0)), (1_100 * MS, (4, 0.8))):
        rows += [(t, "vllm:request_queue_time_seconds_bucket", {"le": "+Inf"}, float(count)),
                 (t, "vllm:request_queue_time_seconds_sum", {}, total),
                 (t, "vllm:request_queue_time_seconds_count", {}, float(count))]
    extra = pa.table({"ts_ns": pa.array([r[0] for r in rows], pa.int64()), "name": [r[1] for r in rows],
                      "labels": [json.dumps(r[2]) for r in rows], "value": pa.array([r[3] for r in rows], pa.float64()),
                      "clock": ["client"] * len(rows)})
    with pa.OSFile(str(path / "server_metrics-queue.arrows"), "wb") as f, pa.ipc.new_stream(f, extra.schema) as w:
        w.write_table(extra)
    app = make_app(path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        text = screen_text(app)
        queue = next(line for line in text.splitlines() if line.strip().startswith("queue"))
        assert "200.0 ms" in queue and "engine metrics" in queue
    # the headline on screen is analyze's, which says what the engine's metrics fill in (it once said
    # only that no server phase was measured while the JSON filled queue in from the histograms)
    import analyzers

    headline = analyzers.analyze(path).to_json()["headline"]
    assert "the engine's own metrics" in headline and "queue at 200.0 ms" in headline
    assert "the engine's own metrics" in " ".join(text.split())


async def test_engine_note_bounds_bucketed_percentiles(tmp_path: Path, make_app: Any) -> None:
    """A real vLLM at low load: 24 queue times summing to 0.72 ms, all in the first bucket (0-0.3 s).
    The note says what the buckets allow (p50 at most 0.06 ms), never the 150 ms that interpolating
    inside the bucket gives, and that the figures come from buckets."""
    path = engine_trace(tmp_path / "engine")
    q = "vllm:request_queue_time_seconds"
    rows = []
    for t, (count, total) in ((0, (0, 0.0)), (1_000 * MS, (24, 0.00072))):
        rows += [(t, f"{q}_bucket", {"le": le}, float(count)) for le in ("0.3", "0.5", "+Inf")]
        rows += [(t, f"{q}_sum", {}, total), (t, f"{q}_count", {}, float(count))]
    extra = pa.table({"ts_ns": pa.array([r[0] for r in rows], pa.int64()), "name": [r[1] for r in rows],
                      "labels": [json.dumps(r[2]) for r in rows], "value": pa.array([r[3] for r in rows], pa.float64()),
                      "clock": ["client"] * len(rows)})
    with pa.OSFile(str(path / "server_metrics-queue.arrows"), "wb") as f, pa.ipc.new_stream(f, extra.schema) as w:
        w.write_table(extra)
    app = make_app(path)
    async with app.run_test(size=(200, 40)) as pilot:
        await settle(pilot)
        await pilot.press("3")
        await settle(pilot)
        note = text_of(app.screen.query_one("#engine-note", Static))
        assert "queue mean 30.0 µs, p50 ≤ 60.0 µs, p95 ≤ 0.60 ms (from buckets)" in note, note
