"""Timings in the response: `probe` alone gives prefill and decode for servers that report them.

llama.cpp's ``llama-server`` puts a ``timings`` object on its last chunk; vLLM
with ``--enable-per-request-metrics`` puts ``metrics`` on its usage chunk when
asked ``include_metrics``. The servers here (uvicorn, tests/serving/openai_doubles.py)
stream exactly those shapes and take the time they report.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serving.openai_doubles import PROMPT_MS, TOKENS, VLLM, UvicornThread, app
from tracetool.reader import open_trace


@pytest.fixture(scope="module")
def double() -> Iterator[UvicornThread]:
    with UvicornThread(app()) as s:
        yield s


def _spans(trace: Path) -> dict[str, dict[str, tuple[int, int, str]]]:
    out: dict[str, dict[str, tuple[int, int, str]]] = {}
    for row in open_trace(trace).table("spans").to_pylist():
        out.setdefault(row["request_id"], {})[row["name"]] = (row["start_ns"], row["end_ns"], row["clock"])
    return out


@pytest.mark.parametrize("usage", [True, False])
def test_llama_cpp_timings_give_prefill_and_decode(usage: bool, double: UvicornThread, cli: Any,
                                                   tmp_path: Path) -> None:
    out = tmp_path / "t"
    args = ["probe", double.url, "--model", "llama-server", "-n", 3, "--concurrency", 1, "-q", "-o", out]
    r = cli(*args, *([] if usage else ["--no-usage"]))
    assert r.code == 0, r.err
    assert "server timings: llama.cpp timings on 3 of 3 ok requests" in r.out, r.out
    spans = _spans(out)
    assert len(spans) == 3
    for s in spans.values():
        assert {"client.request", "prefill", "decode"} <= set(s) and "server.request" not in s
        prefill, decode, client = s["prefill"], s["decode"], s["client.request"]
        assert prefill[1] - prefill[0] == PROMPT_MS * 1e6  # the server's own numbers, to the ns
        assert prefill[2] == decode[2] == "server"
        assert prefill[1] == decode[0]  # prefill ends where decode starts: the first token
        assert client[0] <= prefill[0] and decode[1] - decode[0] < client[1] - client[0]
    a = cli("analyze", out, "--json")
    assert a.code == 0, a.err
    doc = json.loads(a.out)
    comps = doc["components"]
    assert comps["prefill"]["measured"] and comps["decode"]["measured"]
    assert comps["prefill"]["ms"] == pytest.approx(PROMPT_MS)
    # decode as reported (the double's real first-to-last-token time) is what the client saw from
    # its first token to its end, within scheduling noise
    ttft, e2e = doc["ttft_ms"]["mean"], doc["e2e_ms"]["mean"]
    assert comps["decode"]["ms"] == pytest.approx(e2e - ttft, rel=0.2, abs=5)
    assert ttft >= PROMPT_MS
    # no total from the server: network is the round trips the probe's handshake timed, the rest of
    # the client's time beyond the reported phases is the server's own (other), never all network
    ne = doc["network_evidence"]
    assert ne["basis"] == "rtt-split" and comps["network"]["ms"] <= ne["outside_ms"]
    assert comps["other"]["ms"] == pytest.approx(ne["outside_ms"] - comps["network"]["ms"])
    assert not comps["queue"]["measured"]
    assert doc["bottleneck"] in ("prefill", "decode")
    rows = open_trace(out).table("requests").to_pylist()
    assert {row["output_tokens"] for row in rows} == {TOKENS}


def test_vllm_per_request_metrics_give_queue_prefill_and_decode(double: UvicornThread, cli: Any,
                                                                tmp_path: Path) -> None:
    out = tmp_path / "t"
    r = cli("probe", double.url, "--model", "vllm-metrics", "-n", 2, "-q", "-o", out, "--json")
    assert r.code == 0, r.err
    rep = json.loads(r.out)
    assert rep["server_timings"] == {"vLLM metrics": 2}
    assert rep["metrics"]["prefill_ms"]["mean"] == VLLM["time_to_first_token_ms"]
    spans = _spans(out)
    for s in spans.values():
        got = {n: (s[n][1] - s[n][0]) / 1e6 for n in ("queue", "prefill", "decode")}
        assert got == {"queue": VLLM["queue_time_ms"], "prefill": VLLM["time_to_first_token_ms"],
                       "decode": VLLM["generation_time_ms"]}
        assert s["queue"][1] == s["prefill"][0] and s["prefill"][1] == s["decode"][0]  # serving order
