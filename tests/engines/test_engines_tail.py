"""The tail on real engines: vLLM and llama.cpp's llama-server overloaded by bursty arrivals.

``tracetool probe --rate R --burstiness 0.3`` sends gamma-distributed arrivals (burstier than
Poisson) at 80 % of what the engine serves at its slots, measured first: on average it keeps
up, but requests that arrive into a burst wait for a slot. What a user checks:

* the analysis explains the TTFT tail as queueing behind the bursts (``tail-queue-bursts``):
  the tail's extra time over typical requests is the server's wait (vLLM, from its spans: its
  engine's queue, and its API server's time outside the engine's span, which on a loaded
  two-core machine can hold most of it: the API server shares a CPU with the engine and works for
  every request in flight, and the finding then says so) or, where no span measures queue
  (llama-server, whose timings give prefill and decode), outside every measured component while
  the engine's own metrics saw requests waiting; and a load feature (requests in flight,
  arrivals just before) separates the tail requests;
* it agrees with the engine's own queue-time metrics: vLLM's ``vllm:request_queue_time_seconds``
  has the mean of the per-request queue spans the tail is split from, its bucket bound on p95
  holds, and where the queue holds most of the wait, the tail waited longer in it than the
  engine's average request; llama-server's
  ``llamacpp:requests_deferred`` saw requests waiting, and the tail arrived when it had more.

The engines are the tier's session fixtures (tests/engines/conftest.py): started once, and skipped
with the installer's one-line reason where one could not be installed.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.engines.conftest import LLAMA_SLOTS, VLLM_MAX_NUM_SEQS, EngineServer, receiving

pytestmark = [pytest.mark.engines, pytest.mark.slow, pytest.mark.timeout(900)]

#: Requests per run: the p95 tail is then 5 requests, tail_min_requests.
N = 100
PROMPT_TOKENS = 32
MAX_TOKENS = 16
BURSTINESS = 0.3
LOAD = 0.8


def _json(cli: Any, *args: Any) -> dict[str, Any]:
    r = cli(*args)
    assert r.code == 0, r.err
    assert "Traceback" not in r.err
    return json.loads(r.out)


def _probe(cli: Any, url: str, out: Path, *extra: Any) -> dict[str, Any]:
    return _json(cli, "probe", url, "--max-tokens", MAX_TOKENS, "--prompt-tokens", PROMPT_TOKENS, "--ignore-eos",
                 "--timeout", 300, "-q", "--json", "-o", out, *extra)


def _capacity(cli: Any, url: str, out: Path, slots: int) -> float:
    """Requests per second the engine serves with its slots full (a closed loop at its slot count)."""
    rep = _probe(cli, url, out, "-n", 4 * slots, "--concurrency", slots)
    assert rep["failed"] == 0, rep["errors"]
    return float(rep["ok"] / rep["duration_s"])


def _bursty(cli: Any, url: str, out: Path, rate: float, *extra: Any) -> dict[str, Any]:
    rep = _probe(cli, url, out, "-n", N, "--rate", round(rate, 3), "--burstiness", BURSTINESS,
                 "--concurrency", N, "--metrics-url", "auto", *extra)
    assert (rep["ok"], rep["failed"]) == (N, 0), rep["errors"]
    return rep


def _explained(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    t = doc["tail"]["ttft"]
    assert t["explained"] in ("p95", "p99"), t["sentence"]
    return t, t[t["explained"]]


def _findings(doc: dict[str, Any]) -> dict[str, str]:
    return {f["id"]: f["detail"] for f in doc["findings"]}


def test_vllm_under_bursts_its_tail_is_queueing_as_its_queue_metrics_say(
        vllm_server: EngineServer, cli: Any, tmp_path: Path) -> None:
    with receiving(vllm_server, tmp_path / "warm-server") as rx:
        cap = _capacity(cli, vllm_server.url, tmp_path / "warm", VLLM_MAX_NUM_SEQS)
        rx.wait_for_requests(4 * VLLM_MAX_NUM_SEQS)
    with receiving(vllm_server, tmp_path / "server") as rx:
        _bursty(cli, vllm_server.url, tmp_path / "client", LOAD * cap)
        rx.wait_for_requests(N)
    _json(cli, "merge", tmp_path / "client", tmp_path / "server", "-o", tmp_path / "joined", "--json")
    doc = _json(cli, "analyze", tmp_path / "joined", "--json", "--claim", "p95-ttft=network")

    named = _findings(doc)
    assert "tail-queue-bursts" in named, (doc["tail"]["ttft"]["sentence"], sorted(named))
    assert "tail-noise" not in named
    t, tail = _explained(doc)
    q, fe = tail["components"]["queue"], tail["components"]["frontend"]
    assert q["measured"] and fe["measured"], t["sentence"]
    assert t["top_component"] in ("queue", "frontend"), t["sentence"]
    assert q["gap_share"] + max(fe["gap_share"], 0.0) >= 0.5, t["sentence"]
    in_queue = q["gap_share"] >= fe["gap_share"]
    if not in_queue:  # the API server held most of the wait: the finding says where, and its lever
        assert "Most of the wait was in the server's frontend" in named["tail-queue-bursts"]
    loads = {f["feature"] for f in tail["features"] if f["separates"] and f["cliffs_delta"] > 0}
    assert loads & {"in_flight", "arrivals_1s", "engine_waiting"}, tail["features"][:3]
    assert doc["claims"][0]["verdict"] == "misdiagnosis"  # "the p95 TTFT is the network"

    # the engine's own histogram of queue times, scraped by the probe over the same window
    engine = _json(cli, "analyze", tmp_path / "client", "--json")["engine"]
    hist = engine["queue_time_ms"]
    assert engine["source"] == "vllm" and hist["n"] == N
    queues = [r["queue_ms"] for r in _requests(tmp_path / "joined")]
    assert hist["mean"] == pytest.approx(statistics.fmean(queues), rel=0.01, abs=2.0)
    assert hist["p95_max"] >= float(np.percentile(queues, 95)) - 1.0  # the buckets' bound holds
    assert engine["requests_waiting"]["max"] >= 1
    if in_queue:
        assert q["tail_ms"] > hist["mean"]
    print("vLLM tail:", t["sentence"], "| engine queue mean", hist["mean"], "p95 <=", hist["p95_max"])


def test_llama_server_under_bursts_its_tail_is_the_wait_for_a_slot(
        llama_cpp_server: EngineServer, cli: Any, tmp_path: Path) -> None:
    cap = _capacity(cli, llama_cpp_server.url, tmp_path / "warm", LLAMA_SLOTS)
    _bursty(cli, llama_cpp_server.url, tmp_path / "client", LOAD * cap)
    doc = _json(cli, "analyze", tmp_path / "client", "--json")

    named = _findings(doc)
    assert "tail-queue-bursts" in named, (doc["tail"]["ttft"]["sentence"], sorted(named))
    t, tail = _explained(doc)
    # llama-server's timings give prefill per request, not its wait for a slot: the queue is what no
    # component measured, and the engine's own gauge saw requests deferred
    assert not tail["components"]["queue"]["measured"]
    assert tail["components"]["prefill"]["measured"]
    assert tail["components"]["unattributed"]["gap_share"] >= 0.5, t["sentence"]
    engine = doc["engine"]
    assert engine["source"] == "llamacpp" and engine["requests_waiting"]["max"] >= 1
    feats = {f["feature"]: f for f in tail["features"]}
    assert any(feats[k]["separates"] and feats[k]["cliffs_delta"] > 0 for k in ("in_flight", "arrivals_1s",
                                                                                "engine_waiting") if k in feats)
    if "engine_waiting" in feats:  # scrapes once a second: the tail arrived when the engine had more waiting
        assert feats["engine_waiting"]["tail_mean"] >= feats["engine_waiting"]["typical_mean"]
    print("llama-server tail:", t["sentence"])


def _requests(trace: Path) -> list[dict[str, Any]]:
    import analyzers

    return [r for r in analyzers.analyze(trace).rows("attribution_requests") if r["ok"]]
