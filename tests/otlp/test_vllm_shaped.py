"""End to end: a vLLM-shaped server that knows nothing of tracetool, `receive` + `probe` + `merge`.

The server keeps its own request ids and exports vLLM's ``llm_request`` span
through the real OpenTelemetry SDK and OTLP exporter (gRPC, and HTTP with
protobuf), as ``vllm serve --otlp-traces-endpoint`` does. After the three
commands, every request has network, frontend, queue, prefill and decode, and
each duration equals what the server reported (its ground-truth file) within a
few percent, the server's time before its engine's arrival counted as frontend,
not network; the requests joined on the traceparent's trace id, since no id is
shared.
"""

from __future__ import annotations

import json
import signal
from collections import defaultdict
from pathlib import Path

import pytest

from tests.otlp.conftest import Child, start_receiver, start_vllm_shaped
from tracetool.cli import main as cli_main
from tracetool.reader import open_trace

N = 6


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_receive_probe_merge_attributes_a_vllm_shaped_server(tmp_path: Path, children: list[Child],
                                                             protocol: str, capsys: pytest.CaptureFixture[str]) -> None:
    recv_dir, client_dir, joined = tmp_path / "received", tmp_path / "client", tmp_path / "joined"
    truth_file = tmp_path / "truth.jsonl"
    receiver = start_receiver(recv_dir)
    children.append(receiver)
    endpoint = (f"http://{receiver.match['grpc']}" if protocol == "grpc"
                else f"http://{receiver.match['http']}/v1/traces")
    server = start_vllm_shaped(protocol, endpoint, truth_file)
    children.append(server)

    url = f"http://127.0.0.1:{server.match['port']}/v1"
    assert cli_main(["probe", url, "-n", str(N), "--concurrency", "2", "--max-tokens", "6",
                     "--prompt-tokens", "40", "-o", str(client_dir), "-q"]) == 0
    assert server.stop(signal.SIGTERM) == 0, server.text  # flushes its span exporter
    assert receiver.stop(signal.SIGINT) == 0, receiver.text
    assert "Traceback" not in receiver.text
    received = open_trace(recv_dir, strict=True)
    assert received.meta["closed"] is True
    assert received.meta["otlp"]["requests"] == N and received.meta["otlp"]["refused_payloads"] == 0

    capsys.readouterr()
    assert cli_main(["merge", str(client_dir), str(recv_dir), "-o", str(joined), "--json"]) == 0
    out, err = capsys.readouterr()
    rep = json.loads(out)
    assert rep["joined"] == N and rep["client_only"] == 0 and rep["server_only"] == 0
    assert rep["id_join"]["by_trace_id"] == N and rep["id_join"]["by_request_id"] == 0
    assert f"{N} request(s) joined on the W3C trace id" in err

    truth = {r["trace_id"]: r for r in map(json.loads, truth_file.read_text().splitlines())}
    assert len(truth) == N
    trace = open_trace(joined, strict=True)
    got: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for s in trace.table("spans").to_pylist():
        if s["request_id"]:  # '' holds the connect span of the probe's opening model-list call
            got[s["request_id"]][s["name"]] += s["end_ns"] - s["start_ns"]
    assert set(got) == set(truth), "joined under the probe's ids, which are the trace ids"
    for rid, reported in truth.items():
        d = got[rid]
        for phase, key in (("queue", "queue"), ("prefill", "prefill"), ("decode", "decode"),
                           ("server.request", "e2e")):
            want = reported[key] * 1e9
            assert d[phase] == pytest.approx(want, rel=0.02, abs=20_000), (rid, phase)
        network = d["client.request"] - d["server.request"]
        assert 0 < network < d["client.request"] * 0.5, (rid, network)
    requests = {r["request_id"]: r for r in trace.table("requests").to_pylist()}
    assert all(requests[rid]["output_tokens"] == 6 and requests[rid]["status"] == "ok" for rid in truth)
    # the server's own ids stay findable: otlp_spans keeps its gen_ai.request.id
    own = {json.loads(r["attributes"])["gen_ai.request.id"] for r in trace.table("otlp_spans").to_pylist()}
    assert own == {r["request_id"] for r in truth.values()}

    capsys.readouterr()
    assert cli_main(["analyze", str(joined), "--json"]) == 0
    analysis = json.loads(capsys.readouterr().out)
    for component in ("network", "frontend", "queue", "prefill", "decode"):
        assert analysis["components"][component]["share"] is not None, component
    # the server's FRONTEND_S before its engine's arrival is the frontend, not network: network is the
    # loopback round trip the probe's handshakes measured (plus a request's own handshake)
    frontend = min(r["frontend"] for r in truth.values()) * 1e3
    assert analysis["network_evidence"]["basis"] == "rtt-split"
    assert analysis["components"]["frontend"]["ms"] >= 0.7 * frontend
    assert analysis["components"]["network"]["ms"] < analysis["components"]["frontend"]["ms"] / 2
    big = analysis["components"]["frontend"]["share"] >= analysis["thresholds"]["misdiagnosis_share"]
    assert big == ("server-frontend" in {f["id"] for f in analysis["findings"]})
