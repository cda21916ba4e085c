"""``tracetool probe`` against peers that break at the socket level: every request ends, the run finishes.

Complements ``tests/serving/test_probe_errors.py`` (malformed SSE, HTTP 500, a
hang before the response, nothing listening): here the server closes at once,
resets mid-stream, is not HTTP, stalls or drips after the first token, sends
endless bodies or lines, nests JSON 20,000 deep, or reports timings that are
not finite. The run must finish within its timeouts with exit 0, one error per
request (the token that arrived before the fault is kept), a requests row for
every request in the trace, and bounded reads of endless data.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.faults.hostile_server import HostileServer
from tracetool.reader import open_trace

N = 3


def _probe(cli: Any, url: str, out: Path, *extra: Any) -> tuple[Any, dict[str, Any], float]:
    t0 = time.monotonic()
    r = cli("probe", url, "-n", N, "--concurrency", 2, "--timeout", 2, "-q", "--json", "-o", out, *extra)
    took = time.monotonic() - t0
    assert "Traceback" not in r.err, r.err
    return r, (json.loads(r.out) if r.code == 0 else {}), took


@pytest.mark.parametrize(("behaviour", "expect", "first_token_kept"), [
    ("close-at-once", "connection closed before the response", False),
    ("reset-mid-stream", "connection closed mid-stream", True),
    ("garbage-http", "connection closed before the response", False),
    ("stall-mid-stream", "timeout after 2 s", True),
    ("drip", "timeout after 2 s", True),
    ("endless-error-body", "HTTP 500", False),
    ("endless-not-sse", "server did not stream", False),
    ("endless-line", "malformed SSE: a line longer than", True),
    ("deep-json", "malformed SSE: event is not JSON", True),
])
def test_each_request_fails_alone_and_the_run_finishes(behaviour: str, expect: str, first_token_kept: bool,
                                                       cli: Any, tmp_path: Path) -> None:
    with HostileServer(behaviour) as srv:
        r, rep, took = _probe(cli, srv.url, tmp_path / "t")
        sent = srv.sent
    assert r.code == 0, r.err
    assert rep["failed"] == N and rep["ok"] == 0, rep
    errors = [e["error"] for e in rep["errors"]]
    assert errors and all(e.startswith(expect) for e in errors), errors
    # two rounds of requests (concurrency 2), each bounded by --timeout 2, plus start-up
    assert took < 2 * 2 + 10, f"{behaviour}: took {took:.1f} s"
    # endless data is read only up to a bound (what the socket buffers hold is the rest)
    assert sent < 48 << 20, f"{behaviour}: the client let the server push {sent >> 20} MiB"
    rows = open_trace(tmp_path / "t", strict=True).table("requests").to_pylist()
    assert len(rows) == N and all(row["status"] == "error" for row in rows)
    tokens = open_trace(tmp_path / "t").rows("tokens")
    assert tokens == (N if first_token_kept else 0), (behaviour, tokens)


def test_non_finite_server_timing_keeps_the_request(cli: Any, tmp_path: Path) -> None:
    """Timings of 1e999 ms, NaN, negatives or a 400-digit integer are ignored, not a lost request."""
    with HostileServer("nonfinite-timing") as srv:
        r, rep, _ = _probe(cli, srv.url, tmp_path / "t")
    assert r.code == 0, r.err
    assert rep["ok"] == N, rep
    t = open_trace(tmp_path / "t", strict=True)
    assert t.rows("tokens") == 2 * N
    names = t.table("spans").column("name").to_pylist()
    assert names.count("client.request") == N
    assert "server.request" not in names  # no usable server duration: nothing placed by estimate
    assert all(row["status"] == "ok" and row["output_tokens"] == 2 for row in t.table("requests").to_pylist())
    assert "collector errors" not in " ".join(t.meta.get("notes") or [])


@pytest.mark.parametrize(("models", "expect"), [
    ("drip", "timeout"),
    ("garbage", "did not list a model"),
    ("endless", "did not list a model"),
])
def test_a_broken_model_list_is_one_line_and_exit_3(models: str, expect: str, cli: Any) -> None:
    with HostileServer("close-at-once", models=models) as srv:
        t0 = time.monotonic()
        r = cli("probe", srv.url, "-n", 1, "--timeout", 2, "-q")
        took = time.monotonic() - t0
        sent = srv.sent
    assert r.code == 3, r.err
    lines = [ln for ln in r.err.splitlines() if ln.startswith("tracetool: error:")]
    assert len(lines) == 1 and expect in lines[0], r.err
    assert took < 10, f"took {took:.1f} s"
    assert sent < 48 << 20, f"the client let the server push {sent >> 20} MiB"


def test_a_pooled_connection_closed_before_any_byte_is_retried_once(cli: Any, tmp_path: Path) -> None:
    """llama-server closes a connection after each stream; the next request on that pooled
    connection got "Server disconnected without sending a response" and the server never saw it."""
    with HostileServer("pooled-close") as srv:
        r = cli("probe", srv.url, "-n", 4, "--concurrency", 1, "--timeout", 5, "-q", "-o", tmp_path / "t")
        posts = srv.posts
    assert r.code == 0, r.err
    assert "4 ok, 0 failed of 4" in r.out, r.out
    assert "retried x2: a pooled connection was closed before any response byte" in r.out
    assert posts == 6  # four requests, two of them sent twice
    spans = open_trace(tmp_path / "t", strict=True).table("spans").to_pylist()
    retries = [s for s in spans if s["name"] == "client.retry"]
    assert len(retries) == 2 and all(s["clock"] == "client" for s in retries)
    # the retried request's client.request is the attempt that worked, after the failed one
    starts = {s["request_id"]: s["start_ns"] for s in spans if s["name"] == "client.request"}
    assert all(s["end_ns"] <= starts[s["request_id"]] for s in retries)


def test_a_real_failure_stays_a_failure(cli: Any, tmp_path: Path) -> None:
    """Only a pooled connection is retried, and only once: a server that closes new connections too
    fails those requests."""
    with HostileServer("pooled-close-then-refuse") as srv:
        r, rep, _ = _probe(cli, srv.url, tmp_path / "t", "--concurrency", 1, "-n", 4)
        posts = srv.posts
    assert r.code == 0, r.err
    assert (rep["ok"], rep["failed"], rep["retried"]) == (1, 3, 1), rep
    errors = {e["error"]: e["count"] for e in rep["errors"]}
    assert all(e.startswith("connection closed before the response") for e in errors), errors
    assert sum(1 for e in errors if e.endswith("(sent again on a new connection)")) == 1
    assert posts == 5  # the first, the pooled one twice, then two on new connections, never resent
