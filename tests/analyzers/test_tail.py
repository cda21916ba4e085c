"""The tail (modules tail and tail_findings): each scenario's built-in cause is named, noise names none.

The scenarios (tail_scenarios, batch_sim) write requests whose slowness has one known mechanism;
the tests check the cause the analyzer names and that its figures are the generator's: group
membership and component means are recomputed here from what was written, with numpy's percentiles.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tail_scenarios as ts
from batch_sim import run

import analyzers
from analyzers.params import Thresholds

TAIL_IDS = ("tail-queue-bursts", "tail-long-prompts", "tail-prefill-interference", "tail-preemption",
            "tail-slow-replica", "tail-client-delay", "tail-new-connections", "tail-long-outputs", "tail-noise")


def _named(doc: dict[str, Any]) -> dict[str, str]:
    return {f["id"]: f["detail"] for f in doc["findings"] if f["id"].startswith("tail-")}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tail")
    out: dict[str, Any] = {}
    for name in ("queue_bursts", "long_prompts", "client_stalls", "new_connections", "noise"):
        w = getattr(ts, name)(root / name)
        out[name] = (w, analyzers.analyze(w.path).to_json())
    return out


def _case(name: str) -> ts.Case:
    return next(c for c in ts.CASES if c.name == name)


def _ttft(r: ts.TReq) -> float:
    """TTFT as the client measured it: from the intended send time to the first token's arrival."""
    return (r.client_queue or 0) + (r.handshake or 0) + r.network + r.queue + r.tokenize + r.prefill


@pytest.mark.parametrize(("scenario", "cause", "metric"), [
    ("queue_bursts", "tail-queue-bursts", "ttft"),
    ("long_prompts", "tail-long-prompts", "ttft"),
    ("client_stalls", "tail-client-delay", "ttft"),
    ("new_connections", "tail-new-connections", "ttft"),
])
def test_each_scenario_names_its_cause_and_only_its_cause(made: dict[str, Any], scenario: str, cause: str,
                                                          metric: str) -> None:
    _, doc = made[scenario]
    named = _named(doc)
    assert cause in named, (scenario, named)
    # no other request-level cause is named on a trace that has none of the others
    assert set(named) - {cause, "tail-long-outputs"} == set(), named
    assert "tail-noise" not in named
    assert doc["tail"][metric]["explained"] == "p99"


def test_noise_names_no_cause(made: dict[str, Any]) -> None:
    _, doc = made["noise"]
    named = _named(doc)
    assert set(named) == {"tail-noise"}, named
    for m in ("ttft", "e2e", "tpot"):
        t = doc["tail"][m]
        assert t["explained"] == "p99" and t["separating"] == 0, (m, t["features_text"])
        assert "a tail of noise" in t["sentence"]
    assert "no cause named" in named["tail-noise"]


def test_the_groups_and_the_queue_are_the_generators(made: dict[str, Any]) -> None:
    """p99 TTFT of the queue scenario: the requests above numpy's p99 of the written TTFTs, their mean
    queue against the typical (p40-p60) requests' mean queue."""
    w, doc = made["queue_bursts"]
    reqs = list(w.reqs.values())
    ttft = np.array([_ttft(r) for r in reqs])
    queue = np.array([r.queue for r in reqs])
    lo, hi, p99 = np.percentile(ttft, [40, 60, 99])
    tail, typ = ttft > p99, (ttft >= lo) & (ttft <= hi)
    t = doc["tail"]["ttft"]
    assert t["p99"]["n"] == tail.sum() and t["typical"]["n"] == typ.sum()
    assert t["p99"]["lo_ms"] == pytest.approx(p99, rel=1e-6)
    q = t["p99"]["components"]["queue"]
    assert q["tail_ms"] == pytest.approx(queue[tail].mean(), abs=0.01)
    assert q["typical_ms"] == pytest.approx(queue[typ].mean(), abs=0.01)
    gap = ttft[tail].mean() - ttft[typ].mean()
    assert t["p99"]["gap_ms"] == pytest.approx(gap, abs=0.02)
    assert q["gap_share"] == pytest.approx((queue[tail].mean() - queue[typ].mean()) / gap, abs=1e-3)
    # the shares add up to the gap, unattributed included; components no request measured stay null
    shares = [c["gap_share"] for c in t["p99"]["components"].values() if c["measured"]]
    assert sum(shares) == pytest.approx(1.0, abs=1e-6)
    assert t["p99"]["components"]["client_queue"] == {"measured": False, "typical_ms": None, "tail_ms": None,
                                                      "delta_ms": None, "gap_share": None}
    assert t["top_component"] == "queue"


def _cliffs_and_p(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Cliff's delta by counting pairs, and the tie-corrected two-sided Mann-Whitney p (normal approximation)."""
    from math import erfc, sqrt

    gt = (a[:, None] > b[None, :]).sum()
    lt = (a[:, None] < b[None, :]).sum()
    n1, n2 = len(a), len(b)
    u = gt + 0.5 * (n1 * n2 - gt - lt)
    _, counts = np.unique(np.concatenate([a, b]), return_counts=True)
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - (counts ** 3 - counts).sum() / (n * (n - 1)))
    z = abs(u - n1 * n2 / 2) / sqrt(var)
    return (gt - lt) / (n1 * n2), erfc(z / sqrt(2))


def test_feature_effect_sizes_are_cliffs_delta_and_mann_whitney(made: dict[str, Any]) -> None:
    w, doc = made["long_prompts"]
    reqs = list(w.reqs.values())
    ttft = np.array([_ttft(r) for r in reqs])
    prompt = np.array([r.prompt for r in reqs], dtype=float)
    lo, hi, p95 = np.percentile(ttft, [40, 60, 95])
    a, b = prompt[ttft > p95], prompt[(ttft >= lo) & (ttft <= hi)]
    delta, p = _cliffs_and_p(a, b)
    feats = {f["feature"]: f for f in doc["tail"]["ttft"]["p95"]["features"]}
    f = feats["prompt_tokens"]
    assert (f["tail_n"], f["typical_n"]) == (len(a), len(b))
    assert f["cliffs_delta"] == pytest.approx(delta, abs=1e-9)
    compared = len(feats)  # Bonferroni over the features compared at this metric and level
    assert f["p_value"] == pytest.approx(min(1.0, p * compared), rel=1e-5, abs=1e-12)
    assert f["tail_median"] == pytest.approx(np.median(a)) and f["typical_median"] == pytest.approx(np.median(b))
    assert f["ratio"] == pytest.approx(a.mean() / b.mean())
    assert f["separates"] and f["rank"] == 1


def test_client_stalls_quote_the_loop_lag(made: dict[str, Any]) -> None:
    _, doc = made["client_stalls"]
    d = _named(doc)["tail-client-delay"]
    assert "share of the request in load-client loop stalls" in d
    feats = {f["feature"]: f for f in doc["tail"]["ttft"]["p99"]["features"]}
    assert feats["client_lag_share"]["separates"] and feats["client_lag_share"]["cliffs_delta"] > 0.9


def test_claims_about_the_tail(made: dict[str, Any], tmp_path: Path) -> None:
    w, _ = made["queue_bursts"]
    a = analyzers.analyze(w.path, claims=["p99-ttft=network", "p99 TTFT is queueing", "network", "p99-ttft=prefill"])
    c = {x["claim"]: x for x in a.to_json()["claims"]}
    assert c["p99-ttft=network"]["verdict"] == "misdiagnosis" and c["p99-ttft=network"]["scope"] == "p99-ttft"
    assert c["p99-ttft=network"]["basis"] == "tail"
    assert c["p99 TTFT is queueing"]["verdict"] == "supported" and c["p99 TTFT is queueing"]["component"] == "queue"
    assert c["network"]["scope"] is None and c["network"]["basis"] == "measured"
    assert c["p99-ttft=prefill"]["verdict"] == "misdiagnosis"
    # the share is the component's share of the tail's gap
    comps = a.to_json()["tail"]["ttft"]["p99"]["components"]
    assert c["p99 TTFT is queueing"]["share"] == pytest.approx(comps["queue"]["gap_share"])


def test_tail_claims_that_cannot_hold_are_usage_errors() -> None:
    from tracetool.errors import UsageError

    with pytest.raises(UsageError, match="TTFT ends at the first token"):
        analyzers.parse_claim("p99-ttft=decode")
    with pytest.raises(UsageError, match="parts of decode"):
        analyzers.parse_claim("p99-itl=queue")
    with pytest.raises(UsageError, match="preempted time only"):
        analyzers.parse_claim("p99-tpot=prefill")
    with pytest.raises(UsageError, match="say what"):
        analyzers.parse_claim("p99-ttft")
    spec = analyzers.parse_claim("p95-itl=prefill")
    assert (spec.scope, spec.tail_component) == ("p95-itl", "prefill")


def test_a_small_tail_names_nothing(tmp_path: Path) -> None:
    """40 requests: 2 above p95, fewer than tail_min_requests: no cause, and the sentence says why."""
    w = ts.queue_bursts(tmp_path / "small", n=40)
    doc = analyzers.analyze(w.path).to_json()
    assert _named(doc) == {}
    assert doc["tail"]["ttft"]["explained"] is None
    assert "too few to say" in doc["tail"]["ttft"]["sentence"]
    a = analyzers.analyze(w.path, claims=["p99-ttft=queue"])
    assert a.to_json()["claims"][0]["verdict"] == "unmeasured"
    # with the threshold lowered to 2 requests the p95 tail is explained
    lowered = analyzers.analyze(w.path, thresholds=Thresholds().with_overrides({"tail_min_requests": 2})).to_json()
    assert lowered["tail"]["ttft"]["explained"] == "p95"


def test_slow_replica_is_named_on_a_dataset(tmp_path: Path, cli: Any) -> None:
    ts.slow_replica(tmp_path / "fleet", n=800)
    r = cli("analyze", "--json", tmp_path / "fleet")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    named = _named(doc)
    assert "tail-slow-replica" in named and "server=c" in named["tail-slow-replica"], named
    # the one cause: the slow replica's requests are slow in every phase, none of them long or late
    assert set(named) == {"tail-slow-replica"}, named
    feats = {f["feature"]: f for f in doc["tail"]["e2e"]["p99"]["features"]}
    assert feats["replica=server=c"]["separates"] and feats["replica=server=c"]["tail_mean"] == 1.0
    # each replica alone has no replica to compare: no feature of that name
    for t in doc["traces"]:
        assert not any(f["feature"].startswith("replica=") for f in t["tail"]["e2e"]["p99"]["features"])


@pytest.fixture(scope="module")
def batched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tail-batched")
    out = {}
    for name in ("interference", "preempt"):
        sim = run(root / name, ts.BATCHED[name])
        out[name] = (sim, analyzers.analyze(sim.path).to_json())
    return out


def test_prefill_interference_is_behind_the_itl_spikes(batched: dict[str, Any]) -> None:
    _, doc = batched["interference"]
    named = _named(doc)
    assert "tail-prefill-interference" in named and named["tail-prefill-interference"].startswith("p99 ITL")
    itl = doc["tail"]["itl"]
    assert itl["explained"] == "p99" and itl["top_component"] == "prefill"
    # the slow gaps are the ones a prefill-only step delayed: every one waited through prefill, no typical gap did
    assert itl["p99"]["with_prefill_share"] == pytest.approx(1.0) and itl["typical"]["with_prefill_share"] < 0.05
    # its parts add up to the gaps (steps known: nothing unattributed)
    parts = itl["p99"]["components"]
    assert abs(parts["unattributed"]["gap_share"]) < 1e-6
    assert parts["client_side"]["measured"] is False  # server-only trace: not measured, not zero
    # beside it only the queue of an engine the arrivals outpace (its TTFT tail); nothing is preempted
    case = _case("interference")
    assert set(named) <= {case.finding} | case.also, named


def test_preemption_is_named_and_its_stalls_are_the_simulators(batched: dict[str, Any]) -> None:
    sim, doc = batched["preempt"]
    named = _named(doc)
    assert "tail-preemption" in named, named
    # beside it only what this engine also does (tail_scenarios.CASES): its queue grows through the run
    # (the TTFT tail queues) and it prefills in steps of their own (the ITL spikes wait through prefill)
    case = _case("preempt")
    assert set(named) <= {case.finding} | case.also, named
    assert named["tail-preemption"].startswith(("p99 ITL", "p95 ITL", "p99 TPOT", "p95 TPOT"))
    assert named.get("tail-queue-bursts", "p95 TTFT").startswith(("p99 TTFT", "p95 TTFT", "p99 e2e", "p95 e2e"))
    assert named.get("tail-prefill-interference", "p99 ITL").startswith(("p99 ITL", "p95 ITL"))
    tpot = doc["tail"]["tpot"]
    level = tpot["explained"]
    feats = {f["feature"]: f for f in tpot[level]["features"]}
    assert feats["preemptions"]["tail_mean"] > feats["preemptions"]["typical_mean"]
    # the requests the analyzer counts as preempted are the simulator's
    a = analyzers.analyze(sim.path)
    counted = {r["request_id"]
               for r in a.query("SELECT request_id FROM tail_requests WHERE preemptions > 0").to_pylist()}
    assert counted and counted <= sim.preempted


def test_itl_sample_beyond_tail_itl_sample(batched: dict[str, Any]) -> None:
    """With tail_itl_sample below the decode tokens, 1 gap in N is kept: the figures stay close to all gaps'."""
    sim, doc = batched["interference"]
    th = Thresholds().with_overrides({"tail_itl_sample": 5000})
    sampled = analyzers.analyze(sim.path, thresholds=th).to_json()["tail"]["itl"]
    full = doc["tail"]["itl"]
    assert full["sampled_every"] == 1 and sampled["sampled_every"] > 1
    assert sampled["typical"]["n"] < full["typical"]["n"]
    assert sampled["p99"]["mean_ms"] == pytest.approx(full["p99"]["mean_ms"], rel=0.15)
    assert sampled["top_component"] == "prefill"


def test_a_wait_in_the_api_server_before_its_engine_is_the_servers_queue_and_said_so(tmp_path: Path) -> None:
    """A server whose spans are its engine's (vLLM's llm_request) and whose API server makes a burst
    wait before the engine: the tail's extra time is frontend, not queue, and tail-queue-bursts names
    the wait with its place (the frontend's share of the gap is the generator's) and the lever that
    moves it; a server-scope trace of the same requests does not measure the frontend apart."""
    w = ts.frontend_bursts(tmp_path / "fe")
    doc = analyzers.analyze(w.path).to_json()
    named = _named(doc)
    assert set(named) - {"tail-long-outputs"} == {"tail-queue-bursts"}, named
    t = doc["tail"]["ttft"]
    tail = t[t["explained"]]
    fe, q = tail["components"]["frontend"], tail["components"]["queue"]
    assert t["top_component"] == "frontend" and fe["gap_share"] >= 0.9, t["sentence"]
    assert q["measured"] and abs(q["gap_share"]) < 0.01
    # the generator's frontend times, in the groups the analysis formed
    reqs = list(w.reqs.values())
    ttft = np.array([_ttft(r) + r.frontend for r in reqs])
    front = np.array([r.frontend for r in reqs])
    lo, hi, hi_q = np.percentile(ttft, [40, 60, 99 if t["explained"] == "p99" else 95])
    assert fe["tail_ms"] == pytest.approx(front[ttft > hi_q].mean(), rel=0.01)
    assert fe["typical_ms"] == pytest.approx(front[(ttft >= lo) & (ttft <= hi)].mean(), rel=0.05, abs=1.0)
    detail = named["tail-queue-bursts"]
    assert "outside its engine's span, the server's frontend" in detail
    assert "Most of the wait was in the server's frontend" in detail and "more API server processes" in detail
