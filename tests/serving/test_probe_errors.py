"""The probe against servers that misbehave: every failure is a per-request error, the run finishes."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.serving.fakes import FakeServer
from tracetool.reader import open_trace
from tracetool.serving.probe import ProbeConfig, run_probe


def _requests(trace: Path) -> list[dict]:
    return open_trace(trace).table("requests").to_pylist()


@pytest.mark.parametrize(("behaviour", "expect"), [
    ("bad-json", "malformed SSE: event is not JSON"),
    ("not-sse", "malformed SSE: not an SSE line"),
    ("bad-shape", "malformed SSE: 'choices' is not a list"),
    ("no-done", "stream ended before [DONE]"),
    ("http500", "HTTP 500: the engine fell over"),
])
def test_malformed_responses_are_clear_per_request_errors(behaviour: str, expect: str, cli, tmp_path: Path) -> None:
    out = tmp_path / "client"
    with FakeServer(behaviour) as fake:
        r = cli("probe", fake.url, "-n", "3", "--concurrency", "2", "-q", "-o", out)
    assert r.code == 0, r.err  # the run completed: failures are data, not a crash
    assert "Traceback" not in r.err
    assert "0 ok, 3 failed of 3" in r.out
    assert f"failed x3: {expect}" in r.out
    rows = _requests(out)
    assert len(rows) == 3 and all(row["status"] == "error" and row["error"].startswith(expect) for row in rows)


def test_a_good_token_before_the_bad_event_is_kept(tmp_path: Path) -> None:
    with FakeServer("bad-json") as fake:
        res = run_probe(ProbeConfig(url=fake.url, n=1, out=tmp_path / "t", progress=False))
    (r,) = res.results
    assert not r.ok and len(r.token_ns) == 1  # "hi" arrived before the garbage
    assert open_trace(tmp_path / "t").rows("tokens") == 1


def test_a_server_rejecting_stream_options_is_probed_without(tmp_path: Path) -> None:
    with FakeServer("strict") as fake:
        res = run_probe(ProbeConfig(url=fake.url, n=3, concurrency=1, progress=False))
    assert all(r.ok and len(r.token_ns) == 2 and r.output_tokens is None for r in res.results)
    assert fake.requests == 1 + 3 + 1  # the model list, three requests, one of them sent twice


def test_timeout_is_a_per_request_error(cli, tmp_path: Path) -> None:
    with FakeServer("hang") as fake:
        r = cli("probe", fake.url, "-n", "2", "--timeout", "0.5", "-q", "--json")
    assert r.code == 0, r.err
    import json

    rep = json.loads(r.out)
    assert rep["failed"] == 2 and rep["errors"][0]["error"] == "timeout after 0.5 s"


def test_nothing_reachable_exits_3_with_one_line(cli) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    r = cli("probe", f"http://127.0.0.1:{port}", "-n", "2", "-q")
    assert r.code == 3
    lines = [ln for ln in r.err.splitlines() if ln.startswith("tracetool: error:")]
    assert len(lines) == 1 and "cannot reach" in lines[0]
    # with --model the models list is skipped: the requests themselves fail to connect
    r = cli("probe", f"http://127.0.0.1:{port}", "--model", "m", "-n", "2", "-q")
    assert r.code == 3 and "nothing could be reached" in r.err and "connect failed" in r.err


def test_bad_usage(cli, tmp_path: Path) -> None:
    assert cli("probe", "ftp://example/v1", "-q").code == 2
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert cli("probe", "http://127.0.0.1:1", "-o", tmp_path / "full", "-q").code == 2
    r = cli("probe", "http://127.0.0.1:1", "--prompt-file", tmp_path / "missing.txt", "--model", "m", "-q")
    assert r.code in (2, 3) and "Traceback" not in r.err
