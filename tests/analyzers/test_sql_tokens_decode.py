"""Diff tests of tokens.sql, decode.sql, roofline.sql and host.sql on the toy trace.

Request a's decode tokens: kv_len 2000, 3000, 4000 with step times 12, 14, 16 ms
(exactly 8 ms + 2 ms per 1k KV) and server gaps of 20 ms, so the host spends 8,
6, 4 ms between steps. The toy model reads 2e9 weight bytes and 1e5 KV bytes per
token at 1e12 B/s: ideal 2.2, 2.3, 2.4 ms.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from analyzer_scenarios import rows, toy_trace

import analyzers


def test_tokens_gaps_in_index_order_with_both_clocks(toy_con: Any) -> None:
    got = rows(toy_con, "SELECT request_id, index, itl_ms, itl_clock, server_itl_ms, step_ms, host_ms "
                        "FROM tokens_gaps ORDER BY request_id, index")
    assert got == [
        {"request_id": "a", "index": 1, "itl_ms": 20.0, "itl_clock": "client", "server_itl_ms": 20.0,
         "step_ms": 12.0, "host_ms": 8.0},
        {"request_id": "a", "index": 2, "itl_ms": 22.0, "itl_clock": "client", "server_itl_ms": 20.0,
         "step_ms": 14.0, "host_ms": 6.0},
        {"request_id": "a", "index": 3, "itl_ms": 18.0, "itl_clock": "client", "server_itl_ms": 20.0,
         "step_ms": 16.0, "host_ms": 4.0},
        {"request_id": "b", "index": 1, "itl_ms": 20.0, "itl_clock": "server", "server_itl_ms": 20.0,
         "step_ms": None, "host_ms": None},
        {"request_id": "b", "index": 2, "itl_ms": 20.0, "itl_clock": "server", "server_itl_ms": 20.0,
         "step_ms": None, "host_ms": None},
    ]


def test_tokens_requests_and_per_request_itl(toy_con: Any) -> None:
    got = {r["request_id"]: r for r in rows(toy_con, "SELECT * FROM tokens_requests")}
    assert (got["a"]["output_tokens"], got["a"]["first_index"], got["a"]["last_index"]) == (4, 0, 3)
    assert (got["a"]["fit_n"], got["a"]["fit_sx"], got["a"]["fit_sy"]) == (3, 9000.0, 42.0)
    assert (got["b"]["first_emit_ns"], got["b"]["last_emit_ns"], got["b"]["fit_n"]) == (240_000_000, 280_000_000, 0)
    itl = {r["request_id"]: r for r in rows(toy_con, "SELECT * FROM tokens_request_itl")}
    assert itl["a"] == {"trace": "toy", "request_id": "a", "request_key": 1, "gaps": 3, "itl_mean_ms": 20.0,
                        "itl_p50_ms": 20.0, "itl_p90_ms": pytest.approx(21.6), "itl_p99_ms": pytest.approx(21.96),
                        "itl_max_ms": 22.0}


def test_per_request_views_filter_on_the_key(toy_con: Any) -> None:
    key = rows(toy_con, "SELECT request_key FROM attribution_requests WHERE request_id = 'b'")[0]["request_key"]
    got = rows(toy_con, f"SELECT request_id, index FROM tokens_gaps WHERE request_key = {key} ORDER BY index")
    assert got == [{"request_id": "b", "index": 1}, {"request_id": "b", "index": 2}]
    plan = toy_con.execute(f"EXPLAIN SELECT * FROM tokens_gaps WHERE request_key = {key}").fetchall()[0][1]
    assert plan.index(f"request_key = {key}") > plan.index("Window"), "the key filter is applied below the window"


def test_decode_fit_all_and_per_request(toy_con: Any) -> None:
    got = rows(toy_con, "SELECT * FROM decode_fit")
    assert got[0] == {"level": "all", "trace": None, "request_id": None, "basis": "step", "n": 3,
                      "base_ms": pytest.approx(8.0), "per_1k_kv_ms": pytest.approx(2.0), "r2": pytest.approx(1.0),
                      "mean_ms": 14.0, "kv_len_min": 2000, "kv_len_max": 4000, "per_seq_ms": None}
    per = {r["request_id"]: r for r in got[1:]}
    assert per["a"]["per_1k_kv_ms"] == pytest.approx(2.0) and per["a"]["r2"] == pytest.approx(1.0)
    assert per["b"]["n"] == 0 and per["b"]["per_1k_kv_ms"] is None, "no kv_len: no fit, not a zero slope"


def test_decode_fit_falls_back_to_itl_without_step_times(tmp_path: Path) -> None:
    from analyzer_scenarios import Req, scenario

    # ITL 10 ms at kv 1000 growing 1 ms per 1k: emits placed so each gap follows the line
    p = scenario(tmp_path / "t", [Req(output=4, itl=10.0, prompt=1000)])
    con = analyzers.connect([p])
    fit = rows(con, "SELECT * FROM decode_fit")
    assert [f["level"] for f in fit] == ["all"], "per-request ITL fits are the on-demand view"
    assert fit[0]["basis"] == "itl" and fit[0]["n"] == 3
    assert fit[0]["per_1k_kv_ms"] == pytest.approx(0.0, abs=1e-9), "constant 10 ms gaps: flat"
    assert fit[0]["base_ms"] == pytest.approx(10.0)
    on_demand = rows(con, "SELECT * FROM decode_itl_fit")
    assert on_demand[0]["n"] == 3 and on_demand[0]["base_ms"] == pytest.approx(10.0)


def test_roofline_summary_by_hand(toy_con: Any) -> None:
    r = rows(toy_con, "SELECT * FROM roofline_summary")[0]
    assert (r["available"], r["kind"], r["basis"], r["tokens"], r["source"]) == (True, "gpu", "step", 3, "meta.json")
    assert r["weight_bytes"] == 2e9 and r["kv_bytes_per_token"] == 1e5
    assert r["ideal_step_ms"] == pytest.approx(2.3)
    assert r["measured_step_ms"] == pytest.approx(14.0)
    assert r["bandwidth_efficiency"] == pytest.approx(2.3 / 14)
    assert r["ideal_base_ms"] == pytest.approx(2.0) and r["ideal_per_1k_kv_ms"] == pytest.approx(0.1)
    assert r["compute_step_ms"] == pytest.approx(0.02)  # 2 x 1e9 FLOP / 1e14 FLOP/s
    assert r["compute_to_memory"] == pytest.approx(0.02 / 2.3)
    assert r["kv_len_mean"] == pytest.approx(3000.0) and r["batch_mean"] == 1.0


def test_roofline_tokens_view(toy_con: Any) -> None:
    got = rows(toy_con, "SELECT index, measured_ms, ideal_ms FROM roofline_tokens WHERE request_id = 'a' "
                        "ORDER BY index")
    assert [(g["index"], g["measured_ms"]) for g in got] == [(1, 12.0), (2, 14.0), (3, 16.0)]
    assert [g["ideal_ms"] for g in got] == [pytest.approx(2.2), pytest.approx(2.3), pytest.approx(2.4)]


def test_no_roofline_without_hardware_says_why(tmp_path: Path) -> None:
    con = analyzers.connect([toy_trace(tmp_path / "t", with_meta=False)])
    r = rows(con, "SELECT available, kind, note, ideal_step_ms FROM roofline_summary")[0]
    assert (r["available"], r["kind"], r["ideal_step_ms"]) == (False, "unknown", None)
    assert "hardware unknown" in r["note"] and "model unknown" in r["note"]


def test_host_overhead(toy_con: Any) -> None:
    r = rows(toy_con, "SELECT * FROM host_overhead")[0]
    assert r == {"tokens": 3, "itl_mean_ms": 20.0, "step_mean_ms": 14.0, "host_mean_ms": 6.0,
                 "host_share": pytest.approx(0.3), "steps": 0, "step_gap_mean_ms": None, "step_gap_p50_ms": None,
                 # no steps table: a request's waits between its own passes can only be the host's
                 "waited_mean_ms": 0.0, "basis": "token-steps"}


def test_throughput(toy_con: Any) -> None:
    r = rows(toy_con, "SELECT * FROM decode_throughput")[0]
    # 7 tokens over the server-clock extent 10..300 ms; a: 120 ms busy, b: 100 ms
    assert r["output_tokens"] == 7 and r["wall_s"] == pytest.approx(0.29)
    assert r["aggregate_tok_s"] == pytest.approx(7 / 0.29)
    assert r["per_request_tok_s"] == pytest.approx((3000 / 85 + 1000 / 30) / 2)
    assert r["mean_concurrency"] == pytest.approx(0.22 / 0.29)
    assert r["decode_s_mean"] == pytest.approx(((150 - 65) + (100 - 40)) / 2 / 1000)
