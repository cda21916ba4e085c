"""tracetool probe + analyze against the real llama-cpp-python server with the real SmolLM2-135M-Instruct.

Seen by hand once, kept as a test: at concurrency 3 the server
interrupts running streams when a new request arrives (a role chunk, then
[DONE]); those must be errors, never fast "ok" answers. At concurrency 1
every answer is whole and TTFT/ITL are those of a 135M model on a CPU.

llama-cpp-python 0.3.x sends neither usage in the stream nor llama.cpp's
``timings`` (its server is Python over the bindings; ``timings`` come from
llama.cpp's own ``llama-server``), so server phases stay not measured here and
the network verdict rests on the probe's TCP handshakes. Should a later
version send ``timings``, the test checks that they became prefill and decode.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from analyzers.params import Thresholds
from tests.integration.conftest import LlamaServer
from tracetool.reader import open_trace

pytestmark = pytest.mark.integration

MAX_TOKENS = 8
EMPTY = "empty stream: no content token"
UNFINISHED = "stream ended without a finish_reason"


def _probe(cli: Any, url: str, out: Path, n: int, concurrency: int) -> dict[str, Any]:
    r = cli("probe", url, "-n", n, "--concurrency", concurrency, "--max-tokens", MAX_TOKENS,
            "--prompt-tokens", 16, "--timeout", 60, "-q", "--json", "-o", out)
    assert r.code == 0, r.err
    assert "Traceback" not in r.err
    return json.loads(r.out)


def test_concurrency_1_gives_whole_answers_and_sane_latencies(llama_server: LlamaServer, cli: Any,
                                                              tmp_path: Path) -> None:
    rep = _probe(cli, llama_server.url, tmp_path / "c1", n=3, concurrency=1)
    assert (rep["ok"], rep["failed"]) == (3, 0), rep["errors"]
    m = rep["metrics"]
    # SmolLM2-135M on one CPU thread: a prompt of ~40 tokens with the chat template in 0.1-1 s
    # (seconds on a busy shared machine), a token every 20-60 ms; the bounds only rule out nonsense
    assert 1 < m["ttft_ms"]["p50"] < 30_000
    assert 0.2 < m["itl_ms"]["p50"] < 2_000
    assert m["ttft_ms"]["p50"] > m["itl_ms"]["p50"]  # prefill of the whole prompt vs one token
    assert 1 <= rep["output_tokens"] <= 3 * MAX_TOKENS
    rows = open_trace(tmp_path / "c1", strict=True).table("requests").to_pylist()
    assert all(row["status"] == "ok" and row["output_tokens"] >= 1 for row in rows)

    a = cli("analyze", tmp_path / "c1", "--json")
    assert a.code == 0, a.err
    doc = json.loads(a.out)
    assert doc["ttft_ms"]["clock"] == "client" and doc["ttft_ms"]["n"] == 3
    if rep["server_timings"]:  # a server that sends llama.cpp's timings: they are prefill and decode
        assert rep["server_timings"] == {"llama.cpp timings": 3}
        assert doc["components"]["prefill"]["measured"] and doc["components"]["decode"]["measured"]
    else:
        assert not doc["components"]["prefill"]["measured"]
    # client-only evidence: the probe timed the TCP handshake; loopback RTT is far below e2e, so the
    # network story is a misdiagnosis, unless a handshake stalled on a loaded machine pushed the bound
    # over the threshold: then the bounds straddle it and the verdict says nothing (never "supported")
    ne = doc["network_evidence"]
    assert ne["basis"] == "tcp-connect" and ne["connections"] >= 1
    misdiagnosed = ne["bound_share"] < Thresholds().misdiagnosis_share
    assert (ne["verdict"] == "misdiagnosis") == misdiagnosed and ne["verdict"] != "supported", ne
    ids = {f["id"] for f in doc["findings"]}
    assert {"network-unmeasured", "network-rtt-bound"} <= ids


def test_interrupted_streams_are_errors_never_ok(llama_server: LlamaServer, cli: Any, tmp_path: Path) -> None:
    rep = _probe(cli, llama_server.url, tmp_path / "c3", n=6, concurrency=3)
    assert rep["failed"] >= 1, "three at once: llama-cpp-python interrupts the running stream"
    assert rep["ok"] >= 1, "the last request runs alone and finishes"
    errors = [e["error"] for e in rep["errors"]]
    assert all(e.startswith((EMPTY, UNFINISHED)) for e in errors), errors
    rows = open_trace(tmp_path / "c3", strict=True).table("requests").to_pylist()
    assert len(rows) == 6
    assert all(row["output_tokens"] >= 1 for row in rows if row["status"] == "ok")  # no empty answer is ok

    a = cli("analyze", tmp_path / "c3", "--json")
    assert a.code == 0, a.err
    doc = json.loads(a.out)
    assert doc["failed_requests"] == rep["failed"]
    assert doc["ttft_ms"]["n"] == doc["e2e_ms"]["n"] == rep["ok"]  # percentiles over whole answers only
    failed = next(f for f in doc["findings"] if f["id"] == "failed-requests")
    assert failed["detail"].startswith(f"{rep['failed']} of 6 requests failed")
