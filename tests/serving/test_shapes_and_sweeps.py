"""Run shapes, sweeps and SLOs against a real uvicorn server.

--duration bounds a scheduled run by its arrivals; --warmup requests go to OUT/warmup and out of the
figures and the analysis; a sweep writes one valid trace per level and says where the time moved;
--slo gives goodput and attainment, and in a sweep the highest level that meets it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serving.recording_double import RecordingServer, UvicornThread
from tracetool.reader import open_trace
from tracetool.slo import SLO, parse_slo


@pytest.fixture(scope="module")
def fast() -> Iterator[tuple[UvicornThread, RecordingServer]]:
    srv = RecordingServer()
    with UvicornThread(srv.app()) as s:
        yield s, srv


@pytest.fixture(scope="module")
def serial() -> Iterator[tuple[UvicornThread, RecordingServer]]:
    srv = RecordingServer(service_s=0.06)
    with UvicornThread(srv.app()) as s:
        yield s, srv


def test_duration_bounds_a_scheduled_run_by_its_arrivals(fast: Any, cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "t"
    r = cli("probe", fast[0].url, "--rate", 20, "--burstiness", "inf", "--duration", 0.49, "-q", "--json", "-o", out)
    assert r.code == 0, r.err
    assert json.loads(r.out)["requests"] == 10  # due at 0, 50, ..., 450 ms
    assert open_trace(out).table("requests").num_rows == 10


def test_duration_closed_loop_keeps_sending(fast: Any, cli: Any, tmp_path: Path) -> None:
    r = cli("probe", fast[0].url, "--duration", 0.3, "--concurrency", 2, "-q", "--json")
    assert r.code == 0, r.err
    rep = json.loads(r.out)
    assert rep["requests"] >= 2 and rep["failed"] == 0


def test_warmup_is_recorded_apart_and_left_out(fast: Any, cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "t"
    r = cli("probe", fast[0].url, "--rate", 20, "--burstiness", "inf", "-n", 10, "--warmup", 0.175, "-q", "--json",
            "-o", out)
    assert r.code == 0, r.err
    rep = json.loads(r.out)
    assert (rep["requests"], rep["warmup_requests"]) == (6, 4)  # due at 0, 50, 100, 150 ms: warm-up
    assert open_trace(out).table("requests").num_rows == 6
    warm = open_trace(out / "warmup")
    assert warm.table("requests").num_rows == 4 and warm.meta["probe"]["warmup"] is True
    doc = json.loads(cli("analyze", out, "--json").out)
    assert doc["requests"] == 6


def test_a_rate_sweep_writes_a_trace_per_level_and_finds_the_best_level(serial: Any, cli: Any,
                                                                        tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    r = cli("probe", serial[0].url, "--rate", "2,40", "--burstiness", "inf", "--concurrency", 1, "-n", 6,
            "--slo", "e2e_ms=200", "-q", "--json", "-o", out)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert (doc["format"], doc["axis"]) == ("tracetool-sweep", "rate")
    assert [lv["level"] for lv in doc["levels"]] == [2, 40]
    for lv in doc["levels"]:
        t = open_trace(Path(lv["trace"]))
        assert t.table("requests").num_rows == 6 and Path(lv["trace"]).parent == out
    low, high = doc["levels"]
    # at 2/s the server keeps up; at 40/s requests back up in the client (concurrency 1)
    assert low["shares"]["client_queue"] < 0.1 < 0.5 < high["shares"]["client_queue"]
    assert high["client_bound"] and not low["client_bound"]
    assert doc["moved"].startswith("client_queue share ") and "at 2, " in doc["moved"] and "at 40" in doc["moved"]
    assert low["slo"]["met"] and not high["slo"]["met"]
    assert doc["best_level"] == 2
    assert json.loads((out / "sweep.json").read_text()) == doc  # what report --html OUT draws the sweep from
    text = cli("probe", serial[0].url, "--concurrency", "1,2", "-n", 2, "-q", "-o", tmp_path / "c")
    assert text.code == 0, text.err
    assert "where it moved" in text.out and (tmp_path / "c" / "1" / "meta.json").exists()


def test_slo_goodput_and_attainment_in_the_probe_report(fast: Any, cli: Any) -> None:
    r = cli("probe", fast[0].url, "-n", 4, "--concurrency", 1, "--slo", "ttft_ms=60000,e2e_ms=60000", "-q", "--json")
    assert r.code == 0, r.err
    slo = json.loads(r.out)["slo"]
    assert (slo["requests"], slo["met_requests"], slo["attainment"], slo["met"]) == (4, 4, 1.0, True)
    assert slo["goodput_rps"] > 0
    r = cli("probe", fast[0].url, "-n", 2, "--slo", "ttft_ms=0.000001", "-q")
    assert r.code == 0 and "0 of 2 requests met it" in r.out and "NOT met" in r.out


@pytest.mark.parametrize(("args", "said"), [
    (["--slo", "ttft=500"], "--slo: unknown key 'ttft'"),
    (["--slo", "ttft_ms=fast"], "not a number"),
    (["--concurrency", "1,0"], "every level must be > 0"),
    (["--concurrency", "1,2", "--rate", "1,2"], "sweep one of"),
    (["--concurrency", "1,2"], "pass -o DIR"),
    (["--ramp", "2"], "--ramp ramps the --rate schedule"),
])
def test_bad_shape_options_exit_2_and_send_nothing(args: list[str], said: str, fast: Any, cli: Any) -> None:
    before = len(fast[1].received)
    r = cli("probe", fast[0].url, "-q", *args)
    assert r.code == 2 and said in r.err and len(r.err.strip().splitlines()) == 1, (r.code, r.err)
    assert len(fast[1].received) == before


def test_slo_rule() -> None:
    slo = parse_slo("ttft_ms=100,tpot_ms=10,attainment=0.5")
    assert slo == SLO({"ttft_ms": 100.0, "tpot_ms": 10.0}, 0.5)
    rows = [{"ok": True, "ttft_ms": 90, "tpot_ms": None}, {"ok": True, "ttft_ms": 101, "tpot_ms": 5},
            {"ok": False}, {"ok": True, "ttft_ms": 100, "tpot_ms": 10}]
    ev = slo.evaluate(rows, 2.0)
    assert (ev["met_requests"], ev["attainment"], ev["goodput_rps"], ev["met"]) == (2, 0.5, 1.0, True)


def test_closed_loop_warmup_counts_from_the_slot_not_the_queue(serial: Any, cli: Any, tmp_path: Path) -> None:
    """Closed loop: every request is created at once and waits for a slot; warm-up is judged by when
    it got one, so a 60 ms-per-request server at concurrency 1 has a warm-up of the first request only."""
    out = tmp_path / "t"
    r = cli("probe", serial[0].url, "-n", 4, "--concurrency", 1, "--warmup", 0.03, "-q", "--json", "-o", out)
    assert r.code == 0, r.err
    rep = json.loads(r.out)
    assert (rep["requests"], rep["warmup_requests"]) == (3, 1)
