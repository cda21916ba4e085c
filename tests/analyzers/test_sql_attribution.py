"""Diff tests of attribution.sql and latency.sql on the toy trace (values computed by hand).

Request a: client.request 150 ms, server.request 120 ms (network 30), queue 10,
tokenize 2, prefill 28, decode 60, postprocess 5 -> other 120 - 105 = 15;
token 0 reaches the client 65 ms after the request started (TTFT), 4 tokens ->
TPOT (150 - 65) / 3. Request b: server only, 100 ms, prefill 40, decode 40 ->
other 20; token 0 at 240 ms, 40 ms after server.request started; TPOT (100 - 40) / 2.
"""

from __future__ import annotations

from typing import Any

import pytest
from analyzer_scenarios import rows


def test_attribution_requests_by_the_rule(toy_con: Any) -> None:
    got = {r["request_id"]: r for r in rows(toy_con, "SELECT * FROM attribution_requests")}
    a, b = got["a"], got["b"]
    assert a == {
        "trace": "toy", "request_id": "a", "request_key": 1, "ok": True, "e2e_ms": 150.0, "e2e_source": "client",
        "client_queue_ms": None, "network_ms": 30.0, "frontend_ms": None, "outside_ms": None, "queue_ms": 10.0,
        "tokenize_ms": 2.0, "preprocess_ms": None, "prefill_ms": 28.0,
        "decode_ms": 60.0, "detokenize_ms": None, "postprocess_ms": 5.0, "other_ms": 15.0, "server_ms": 120.0,
        "ttft_ms": 65.0, "ttft_source": "client", "tpot_ms": pytest.approx(85 / 3), "itl_mean_ms": 20.0,
        "output_tokens": 4, "prompt_tokens": None, "decode_tok_s": pytest.approx(3000 / 85),
        "start_ns": 10_000_000, "end_ns": 130_000_000, "bottleneck": "decode"}
    assert (b["e2e_ms"], b["e2e_source"], b["network_ms"], b["other_ms"]) == (100.0, "server", None, 20.0)
    assert (b["ttft_ms"], b["ttft_source"], b["tpot_ms"], b["output_tokens"]) == (40.0, "server", 30.0, 3)
    assert b["queue_ms"] is None and b["tokenize_ms"] is None, "no span means not measured, not zero"
    assert b["bottleneck"] == "prefill", "a tie (prefill 40, decode 40) goes to the earlier component"


def test_components_shares_and_measured(toy_con: Any) -> None:
    got = {r["component"]: r for r in rows(toy_con, "SELECT * FROM attribution_components")}
    # sum of e2e = 250 ms
    expect = {"client_queue": (False, 0, None, None), "network": (True, 1, 30.0, 0.12),
              "frontend": (False, 0, None, None), "queue": (True, 1, 10.0, 0.04),
              "tokenize": (True, 1, 2.0, 0.008), "preprocess": (False, 0, None, None),
              "prefill": (True, 2, 34.0, 0.272), "decode": (True, 2, 50.0, 0.4),
              "detokenize": (False, 0, None, None), "postprocess": (True, 1, 5.0, 0.02),
              "other": (True, 2, 17.5, 0.14)}
    for name, (measured, n, ms, share) in expect.items():
        r = got[name]
        assert (r["measured"], r["requests"]) == (measured, n), name
        assert r["ms"] == (pytest.approx(ms) if ms is not None else None), name
        assert r["share"] == (pytest.approx(share) if share is not None else None), name
    assert [n for n, r in got.items() if r["bottleneck"]] == ["decode"]
    assert list(got) == ["client_queue", "network", "frontend", "queue", "tokenize", "preprocess", "prefill", "decode",
                         "detokenize", "postprocess", "other"]
    assert sum(r["share"] or 0 for r in got.values()) == pytest.approx(1.0)


def test_latency_percentiles_interpolate_like_numpy(toy_con: Any) -> None:
    got = {r["metric"]: r for r in rows(toy_con, "SELECT * FROM latency_percentiles")}
    assert list(got) == ["e2e", "ttft", "itl", "tpot"]
    assert got["e2e"] == {"metric": "e2e", "clock": "mixed", "n": 2, "mean_ms": 125.0, "p50_ms": 125.0,
                          "p90_ms": 145.0, "p95_ms": 147.5, "p99_ms": 149.5}
    assert (got["ttft"]["n"], got["ttft"]["mean_ms"], got["ttft"]["p90_ms"]) == (2, 52.5, 62.5)
    # ITL: a's client gaps 20, 22, 18 and b's server gaps 20, 20 (index 0 has none)
    itl = got["itl"]
    assert (itl["n"], itl["clock"], itl["mean_ms"], itl["p50_ms"]) == (5, "mixed", 20.0, 20.0)
    assert itl["p90_ms"] == pytest.approx(21.2) and itl["p95_ms"] == pytest.approx(21.6)
    assert itl["p99_ms"] == pytest.approx(21.92)
    assert got["tpot"]["mean_ms"] == pytest.approx((85 / 3 + 30) / 2)


def test_failed_requests_are_left_out_of_aggregates(tmp_path: Any) -> None:
    import pyarrow as pa
    from analyzer_scenarios import Req, scenario

    import analyzers

    p = scenario(tmp_path / "t", [Req(output=5, prefill=10), Req(output=5, prefill=1000)])
    pa_req = pa.table({"request_id": ["req-001"], "status": ["error"], "error": ["boom"]})
    from analyzer_scenarios import write_stream

    write_stream(p / "requests.arrows", pa_req)
    con = analyzers.connect([p])
    assert rows(con, "SELECT request_id, ok FROM attribution_requests ORDER BY 1") == [
        {"request_id": "req-000", "ok": True}, {"request_id": "req-001", "ok": False}]
    e2e = rows(con, "SELECT n FROM latency_percentiles WHERE metric = 'e2e'")[0]["n"]
    prefill = rows(con, "SELECT ms FROM attribution_components WHERE component = 'prefill'")[0]["ms"]
    assert (e2e, prefill) == (1, 10.0)
    assert rows(con, "SELECT gaps FROM tokens_gap_stats")[0]["gaps"] == 4
    ids = [r["id"] for r in rows(con, "SELECT id FROM findings")]
    assert "failed-requests" in ids


def test_a_failed_request_without_tokens_counts_as_failed(tmp_path: Any) -> None:
    import pyarrow as pa
    from analyzer_scenarios import MS, spans, tokens, write_trace

    import analyzers

    p = write_trace(tmp_path / "t", {
        "spans": spans([("ok", "server.request", 0, 50 * MS, "server"),
                        ("bad", "server.request", 0, 900 * MS, "server")]),
        "tokens": tokens([{"request_id": "ok", "index": i, "emit_ns": (10 + i) * MS} for i in range(3)]),
        "requests": pa.table({"request_id": ["bad"], "status": ["error"]})})
    con = analyzers.connect([p])
    assert rows(con, "SELECT request_id, ok FROM attribution_requests ORDER BY 1") == [
        {"request_id": "bad", "ok": False}, {"request_id": "ok", "ok": True}]
    assert rows(con, "SELECT n, mean_ms FROM latency_percentiles WHERE metric = 'e2e'") == [{"n": 1, "mean_ms": 50.0}]


def test_the_helper_table_lists_the_schemas_components(toy_con: Any) -> None:
    """attribution.sql writes the components once, and they are the trace contract's."""
    from tracetool.schema import COMPONENTS

    got = rows(toy_con, "SELECT ordinal, component FROM _attribution_components ORDER BY ordinal")
    assert [(r["ordinal"], r["component"]) for r in got] == list(enumerate(COMPONENTS))
    long = rows(toy_con, "SELECT DISTINCT ordinal FROM _attribution_long ORDER BY ordinal")
    assert [r["ordinal"] for r in long] == list(range(len(COMPONENTS))), "every component has its column"


def test_client_queue_counts_in_e2e_ttft_and_its_own_component(tmp_path: Any) -> None:
    """A scheduled load run: due at 0, sent at 40 ms (client.queue), answered by 140 ms. e2e and TTFT
    count from the intended send; network is still client.request - server.request; TPOT unchanged."""
    from analyzer_scenarios import MS, spans, tokens, write_trace

    import analyzers

    p = write_trace(tmp_path / "t", {
        "spans": spans([("r", "client.queue", 0, 40 * MS, "client"),
                        ("r", "client.request", 40 * MS, 140 * MS, "client"),
                        ("r", "server.request", 1000 * MS, 1090 * MS, "server"),
                        ("r", "decode", 1030 * MS, 1090 * MS, "server")]),
        "tokens": tokens([{"request_id": "r", "index": i, "emit_ns": (1030 + 20 * i) * MS,
                           "client_recv_ns": (70 + 20 * i) * MS} for i in range(4)])})
    con = analyzers.connect([p])
    r = rows(con, "SELECT e2e_ms, client_queue_ms, network_ms, ttft_ms, tpot_ms, other_ms, bottleneck "
                  "FROM attribution_requests")[0]
    assert r == {"e2e_ms": 140.0, "client_queue_ms": 40.0, "network_ms": 10.0, "ttft_ms": 70.0,
                 "tpot_ms": pytest.approx(70 / 3), "other_ms": 30.0, "bottleneck": "decode"}
    comps = {c["component"]: c for c in rows(con, "SELECT * FROM attribution_components")}
    assert comps["client_queue"]["share"] == pytest.approx(40 / 140)
    assert comps["client_queue"]["ordinal"] == 0
    assert sum(c["share"] or 0 for c in comps.values()) == pytest.approx(1.0)


def _client_bound(tmp_path: Any, lag_ms: float) -> dict[str, Any] | None:
    """Ten requests due every 10 ms (100/s offered) but sent every 20 ms (50/s achieved), each answered
    in 100 ms (so at most 5 in flight); ``lag_ms`` of client.loop_lag stalls per request (request_id '')."""
    from analyzer_scenarios import MS, spans, write_trace

    import analyzers

    span_rows = []
    for i in range(10):
        due, sent = i * 10 * MS, i * 20 * MS
        span_rows += [(f"r{i}", "client.queue", due, sent, "client"),
                      (f"r{i}", "client.request", sent, sent + 100 * MS, "client")]
        if lag_ms:
            span_rows.append(("", "client.loop_lag", due, due + round(lag_ms * MS), "client"))
    con = analyzers.connect([write_trace(tmp_path / f"t{lag_ms}", {"spans": spans(span_rows)})])
    found = rows(con, "SELECT id, detail FROM findings WHERE id = 'client-bound'")
    return found[0] if found else None


def test_client_bound_names_the_concurrency_cap_or_the_event_loop(tmp_path: Any) -> None:
    cap = _client_bound(tmp_path, 0)
    assert cap is not None
    assert "it sent 50.00 requests/s of the 100.00 offered (50.0 %)" in cap["detail"]
    assert "requests waited 45.0 ms each" in cap["detail"]  # 0, 10, ..., 90 ms
    assert "the concurrency cap (at most 5 requests in flight" in cap["detail"]
    loop = _client_bound(tmp_path, 30)  # 300 ms of stalls against 450 ms of waiting
    assert loop is not None and "the probe's own event loop (10 stalls over 1 ms, worst 30.0 ms)" in loop["detail"]
