"""Client-only evidence on the network and what the findings say of one-sided traces.

Tiny inline traces written with pyarrow, as tracetool probe writes them: client.request spans,
client.connect handshakes, tokens with client receipt times, and (for llama.cpp-like servers)
prefill/decode spans but no server.request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from analyzer_scenarios import MS, Req, scenario, spans, tokens, write_trace

import analyzers


def client_trace(path: Path, *, e2e_ms: float, rtt_ms: list[float], n: int = 4, out_tokens: int = 20,
                 phases: bool = False) -> Path:
    """``n`` requests of ``e2e_ms`` each seen by a client only; the first len(rtt_ms) opened a
    connection whose handshake took that long. ``phases``: the server reported prefill and decode."""
    rows, toks = [], []
    for i in range(n):
        rid, t0 = f"r{i}", i * 10_000 * MS
        rows.append((rid, "client.request", t0, t0 + round(e2e_ms * MS), "client"))
        if i < len(rtt_ms):
            rows.append((rid, "client.connect", t0, t0 + round(rtt_ms[i] * MS), "client"))
        first = t0 + round(e2e_ms * MS / 4)
        step = (t0 + round(e2e_ms * MS) - first) // out_tokens
        for k in range(out_tokens):
            recv = first + k * step
            toks.append({"request_id": rid, "index": k, "emit_ns": recv, "client_recv_ns": recv})
        if phases:
            rows.append((rid, "prefill", first - 50 * MS, first, "server"))
            rows.append((rid, "decode", first, first + (out_tokens - 1) * step, "server"))
    return write_trace(path, {"spans": spans(rows), "tokens": tokens(toks)}, {"closed": True})


def detail(a: Any, fid: str) -> str | None:
    return next((f["detail"] for f in a.to_json()["findings"] if f["id"] == fid), None)


def test_a_client_only_trace_bounds_the_network_with_its_handshakes(tmp_path: Path) -> None:
    a = analyzers.analyze(client_trace(tmp_path / "t", e2e_ms=1000, rtt_ms=[0.8, 1.0]), claims=["network-rtt"])
    ne = a.to_json()["network_evidence"]
    assert (ne["basis"], ne["connections"], ne["client_requests"], ne["server_requests"]) == ("tcp-connect", 2, 4, 0)
    assert ne["rtt_ms"] == pytest.approx(0.9) and ne["rtt_min_ms"] == pytest.approx(0.8)
    assert ne["bound_ms"] == pytest.approx(9.0) and ne["bound_share"] == pytest.approx(0.009)
    assert ne["verdict"] == "misdiagnosis"
    assert detail(a, "network-rtt-bound") == (
        "network is not measured per request, but the TCP handshake takes 0.90 ms (median of 2 new connections, "
        "one round trip each): network >= RTT 0.90 ms = 0.090 % of e2e (mean 1.00 s); even 10 round trips would be "
        "0.9 % of e2e: the network is not the story (a proxy that accepts connections and then waits would hide "
        "behind a short handshake)")
    (claim,) = a.to_json()["claims"]
    assert (claim["verdict"], claim["basis"], claim["share"]) == ("misdiagnosis", "rtt-bound", None)
    assert "0.90 ms = 0.090 % of e2e and 10 round trips at 0.9 %" in claim["detail"]


@pytest.mark.parametrize(("e2e_ms", "rtt_ms", "trips", "verdict"), [
    (400, 150, 10, "supported"),     # one round trip is 37.5 % of e2e: a long link under tiny answers
    (1000, 20, 10, "unmeasured"),    # 2 % .. 20 %: the bounds straddle misdiagnosis_share
    (1000, 110, 3, "contributing"),  # 11 % .. 33 %: between the two thresholds
])
def test_the_network_claim_on_the_bound(e2e_ms: float, rtt_ms: float, trips: float, verdict: str,
                                        tmp_path: Path) -> None:
    a = analyzers.analyze(client_trace(tmp_path / "t", e2e_ms=e2e_ms, rtt_ms=[rtt_ms]), claims=["network"],
                          thresholds=analyzers.Thresholds(network_bound_round_trips=trips))
    (claim,) = a.to_json()["claims"]
    assert (claim["verdict"], claim["basis"]) == (verdict, "rtt-bound")
    assert a.to_json()["network_evidence"]["verdict"] == (None if verdict == "unmeasured" else verdict)
    assert "(one new connection, one round trip each)" in detail(a, "network-rtt-bound")
    assert "the TCP handshake (one connection) puts one round trip at" in claim["detail"]
    if verdict == "unmeasured":
        assert "straddle a threshold: measure it with server timing" in claim["detail"]
        assert "the network may matter; measure it with server timing" in detail(a, "network-rtt-bound")


def test_client_only_wording_says_what_is_measured_and_the_next_step(tmp_path: Path) -> None:
    """On a probe trace, no "record the client side (tracetool probe)", no "no component holds -"."""
    a = analyzers.analyze(client_trace(tmp_path / "t", e2e_ms=300, rtt_ms=[0.5], out_tokens=3))
    text = detail(a, "network-unmeasured")
    assert text is not None and "tracetool probe" not in text
    assert text == ("network time is unknown (not zero): a client-side trace measures e2e, TTFT and ITL, not the "
                    "server's total time (no server.request span). Next: server timing, then tracetool merge "
                    "(tracetool's middleware in a server you run; tracetool receive for the OTLP spans of vLLM, "
                    "TGI or SGLang)")
    short = detail(a, "short-outputs")
    assert short is not None and " holds -" not in short and "no component" not in short
    assert short.endswith("first to last token the other 75.0 %: decode is not the story here")


def test_reported_phases_without_a_total_split_the_rest_into_network_and_other(tmp_path: Path) -> None:
    # llama.cpp's timings: prefill and decode, no total. The client's time beyond them is network
    # (a round trip per request and per handshake, the shortest handshake being 1 ms) and the
    # server's time outside its phases (other), never all network
    a = analyzers.analyze(client_trace(tmp_path / "t", e2e_ms=1000, rtt_ms=[1.0], phases=True))
    doc = a.to_json()
    reqs = {r["request_id"]: r for r in a.requests.to_pylist()}
    phases = {rid: r["prefill_ms"] + r["decode_ms"] for rid, r in reqs.items()}
    assert reqs["r0"]["network_ms"] == pytest.approx(2.0) and reqs["r1"]["network_ms"] == pytest.approx(1.0)
    assert reqs["r1"]["outside_ms"] == pytest.approx(1000 - phases["r1"])
    assert reqs["r1"]["other_ms"] == pytest.approx(1000 - phases["r1"] - 1.0)
    assert doc["network_evidence"]["basis"] == "rtt-split" and doc["network_evidence"]["frontend_ms"] is None
    assert not doc["components"]["frontend"]["measured"] and doc["components"]["other"]["measured"]
    assert detail(a, "network-unmeasured") is None


def test_reported_phases_without_a_total_or_a_handshake_are_not_split(tmp_path: Path) -> None:
    a = analyzers.analyze(client_trace(tmp_path / "t", e2e_ms=1000, rtt_ms=[], phases=True))
    doc = a.to_json()
    assert doc["components"]["prefill"]["measured"] and not doc["components"]["network"]["measured"]
    assert not doc["components"]["other"]["measured"]
    assert doc["network_evidence"]["basis"] == "unsplit"
    assert "beyond what the server says it spent (its reported phases)" in detail(a, "network-frontend-unsplit")


def test_a_server_side_trace_is_told_to_record_the_client(tmp_path: Path) -> None:
    a = analyzers.analyze(scenario(tmp_path / "t", [Req(output=20)]))
    assert "a server-side trace" in detail(a, "network-unmeasured")
    assert "record the client side (tracetool probe)" in detail(a, "network-unmeasured")
    assert a.to_json()["network_evidence"]["basis"] == "none"
    assert detail(a, "network-rtt-bound") is None


def test_a_measured_network_is_the_basis(tmp_path: Path) -> None:
    a = analyzers.analyze(scenario(tmp_path / "t", [Req(network=40.0, output=20)]), claims=["network"])
    doc = a.to_json()
    assert doc["network_evidence"]["basis"] == "measured" and doc["network_evidence"]["measured_requests"] == 1
    assert doc["claims"][0]["basis"] == "measured"
    assert detail(a, "network-unmeasured") is None and detail(a, "network-rtt-bound") is None
