"""Latency from the intended send time: a request's wait in the load client is latency.

A serial server (one request at a time, each taking SERVICE_S) is driven at
``--rate 20 --concurrency 1`` with evenly spaced arrivals (``--burstiness inf``):
every request is due 50 ms after the previous one but can be sent only when the
previous one has finished, so the backlog grows by a fixed step per request. The
wait is recorded as a ``client.queue`` span, counted in e2e and TTFT, attributed
to its own component, and ``client-bound`` fires. At a rate the server can serve,
nothing waits and the finding stays silent.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import analyzers
from tests.serving.recording_double import RecordingServer, UvicornThread
from tests.waiting import wait_until_async
from tracetool.reader import open_trace
from tracetool.serving import schedule

SERVICE_S = 0.12


@pytest.fixture(scope="module")
def serial() -> Iterator[tuple[UvicornThread, RecordingServer]]:
    srv = RecordingServer(service_s=SERVICE_S)
    with UvicornThread(srv.app()) as s:
        yield s, srv


def _requests(trace: Path) -> list[dict[str, Any]]:
    """Per request, in intended-send order: client.queue and client.request spans (ns)."""
    spans = open_trace(trace).table("spans").to_pylist()
    by: dict[str, dict[str, Any]] = {}
    for s in spans:
        if s["request_id"]:
            by.setdefault(s["request_id"], {"id": s["request_id"]})[s["name"]] = (s["start_ns"], s["end_ns"])
    return sorted(by.values(), key=lambda d: d["client.queue"][0])


def test_overload_shows_as_client_queue_and_client_bound(serial: Any, cli: Any, tmp_path: Path) -> None:
    url = serial[0].url
    out = tmp_path / "t"
    r = cli("probe", url, "--rate", 20, "--burstiness", "inf", "--concurrency", 1, "-n", 10, "-q",
            "--json", "-o", out)
    assert r.code == 0, r.err
    rep = json.loads(r.out)
    reqs = _requests(out)
    assert len(reqs) == 10
    waits = [(d["client.queue"][1] - d["client.queue"][0]) / 1e6 for d in reqs]
    e2e = [(d["client.request"][1] - d["client.queue"][0]) / 1e6 for d in reqs]
    # due every 50 ms, served every 120+ ms: the wait grows by ~70 ms per request
    assert waits[0] < 50
    assert all(b > a for a, b in itertools.pairwise(waits)), waits
    assert all(b > a for a, b in itertools.pairwise(e2e)), e2e
    for d in reqs:  # the queue ends where the request is sent
        assert d["client.queue"][1] == d["client.request"][0]
    # the probe's own report: e2e from the intended send, the client-bound verdict and its limit
    assert rep["metrics"]["e2e_ms"]["p99"] >= waits[-1]
    client = rep["client"]
    assert client["offered_rps"] == pytest.approx(20, rel=0.01)
    assert client["achieved_rps"] < 0.9 * client["offered_rps"]
    assert client["client_queue_share"] > 0.5
    assert "concurrency cap (1 in flight)" in client["client_bound"]
    # the analysis: its own component, the biggest; the finding names the limit
    a = cli("analyze", out, "--json")
    assert a.code == 0, a.err
    doc = json.loads(a.out)
    comp = doc["components"]["client_queue"]
    assert comp["measured"] and comp["requests"] == 10
    assert comp["ms"] == pytest.approx(sum(waits) / 10, rel=1e-3)
    assert doc["bottleneck"] == "client_queue"
    assert doc["e2e_ms"]["mean"] == pytest.approx(sum(e2e) / 10, rel=1e-3)
    found = {f["id"]: f for f in doc["findings"]}
    assert "client-bound" in found, [f["id"] for f in doc["findings"]]
    detail = found["client-bound"]["detail"]
    assert "of the 20.00 offered" in detail and "concurrency cap (at most 1 requests in flight" in detail


def test_a_rate_the_server_can_serve_is_not_client_bound(serial: Any, cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "t"
    r = cli("probe", serial[0].url, "--rate", 4, "--burstiness", "inf", "--concurrency", 1, "-n", 6, "-q",
            "--json", "-o", out)
    assert r.code == 0, r.err
    rep = json.loads(r.out)
    assert rep["client"]["client_bound"] is None, rep["client"]
    assert rep["client"]["achieved_rps"] >= 0.9 * rep["client"]["offered_rps"]
    doc = json.loads(cli("analyze", out, "--json").out)
    assert "client-bound" not in {f["id"] for f in doc["findings"]}
    assert doc["components"]["client_queue"]["share"] < 0.10


def test_closed_loop_has_no_schedule_and_no_client_queue(serial: Any, cli: Any, tmp_path: Path) -> None:
    """Without --rate there is no intended send time: a request is due when a slot frees."""
    out = tmp_path / "t"
    assert cli("probe", serial[0].url, "-n", 3, "--concurrency", 1, "-q", "-o", out).code == 0
    names = {s["name"] for s in open_trace(out).table("spans").to_pylist()}
    assert "client.queue" not in names and "client.request" in names
    doc = json.loads(cli("analyze", out, "--json").out)
    assert doc["components"]["client_queue"]["measured"] is False


def test_the_serial_double_speaks_the_stream_format() -> None:
    srv = RecordingServer(tokens=2)
    with UvicornThread(srv.app()) as s:
        client = openai.OpenAI(base_url=s.url, api_key="x", max_retries=0)
        text = ""
        for ch in client.chat.completions.create(model="serial", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True):
            if ch.choices:
                text += ch.choices[0].delta.content or ""
    assert text == " w0 w1"
    assert srv.received[0]["messages"] == [{"role": "user", "content": "hi"}]


def test_the_probe_and_the_analyzer_share_the_client_bound_thresholds() -> None:
    t = analyzers.Thresholds()
    assert (t.client_rate_ratio, t.client_queue_share) == (schedule.CLIENT_RATE_RATIO, schedule.CLIENT_QUEUE_SHARE)


def test_arrival_offsets_shapes() -> None:
    even = schedule.arrival_offsets(5, 20, burstiness=float("inf"))
    assert even == pytest.approx([0, 0.05, 0.10, 0.15, 0.20])
    poisson = schedule.arrival_offsets(2000, 10, seed=3)
    assert poisson[0] == 0 and poisson == sorted(poisson)
    assert (len(poisson) - 1) / poisson[-1] == pytest.approx(10, rel=0.1)
    assert schedule.arrival_offsets(None, 10, burstiness=float("inf"), duration_s=0.95)[-1] == pytest.approx(0.9)
    ramp = schedule.arrival_offsets(None, 10, burstiness=float("inf"), ramp_s=2.0, duration_s=4.0)
    gaps = [b - a for a, b in itertools.pairwise(ramp)]
    assert gaps[0] > gaps[-1] == pytest.approx(0.1)  # sparse while ramping, the full rate after
    assert len(ramp) == pytest.approx(10 * (4 - 1.0), abs=1)  # the ramp delivers half its full-rate arrivals


def test_the_probe_warns_once_near_its_limit(capsys: pytest.CaptureFixture[str]) -> None:
    """The loop monitor's window callback: a window with 5 % or more late wake-ups says so once."""
    from tracetool import notices
    from tracetool.serving.probe import ProbeConfig, Prober

    notices._said.discard("probe-loop-lag")
    p = Prober(ProbeConfig(url="http://127.0.0.1:9/v1", progress=False))
    p._on_loop_window(0.01, 1.5)  # 1 % late: quiet
    assert "lagging" not in capsys.readouterr().err
    p._on_loop_window(0.2, 12.0)
    p._on_loop_window(0.3, 20.0)
    err = capsys.readouterr().err
    assert err.count("the probe's event loop is lagging (20 % of wake-ups later than 1 ms, worst 12.0 ms)") == 1


def test_the_loop_monitor_counts_late_wakeups() -> None:
    """An injected clock that jumps 3 ms past each due time: every wake-up is late, and windows report it."""
    import asyncio

    ticks = iter(range(0, 10**12, 3_000_000 + 5_000_000))
    seen: list[tuple[float, float]] = []
    mon = schedule.LoopMonitor(lambda: next(ticks), interval_s=0.0, window_s=0.0,
                               on_window=lambda share, worst: seen.append((share, worst)))

    async def go() -> None:
        task = asyncio.ensure_future(mon.run())
        await wait_until_async(lambda: mon.stats.wakeups >= 5, "five wake-ups of the loop monitor", interval=0)
        task.cancel()

    asyncio.run(go())
    assert mon.stats.late == mon.stats.wakeups >= 5
    assert mon.stats.max_lag_ms == pytest.approx(8.0)
    assert seen and all(share == 1.0 for share, _ in seen)
