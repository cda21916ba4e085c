"""The middleware recipe of docs/serving.md on a real uvicorn in a child process: the trace
ends closed when a process manager stops the server, and merge joins what the client saw."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

import analyzers
from tracetool.merge import merge_traces
from tracetool.reader import open_trace
from tracetool.serving.probe import ProbeConfig, run_probe

SCRIPT = Path(__file__).parent / "scripts" / "middleware_server.py"


@contextmanager
def middleware_server(trace: Path, *extra: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """The recipe's server in a child; yields (API root URL, process) once uvicorn accepts."""
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(trace), *extra], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    found: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            m = re.search(r"running on (http://127\.0\.0\.1:\d+)", line)
            if m and not found:
                found.append(m.group(1))
                ready.set()
        ready.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        ready.wait(60)
        assert found, f"the server did not start (exit {proc.poll()})"
        yield f"{found[0]}/v1", proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        reader.join(5)


def stop(proc: subprocess.Popen[str], sig: int) -> int:
    proc.send_signal(sig)
    return proc.wait(30)


def _stream(url: str, rid: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{url}/chat/completions", json=body, headers={"X-Request-ID": rid}) as r:
        assert r.status_code == 200
        assert "[DONE]" in "".join(r.iter_text())


@pytest.mark.parametrize(("sig", "lifespan"), [(signal.SIGTERM, "auto"), (signal.SIGINT, "auto"),
                                             (signal.SIGTERM, "off")], ids=["SIGTERM", "SIGINT", "SIGTERM-no-lifespan"])
def test_recipe_ends_with_a_closed_trace_when_the_server_is_stopped(tmp_path: Path, sig: int, lifespan: str) -> None:
    """uvicorn re-raises the stop signal after its shutdown; for SIGTERM that kills the process
    before ``finally: rec.close()`` runs: the trace read ``"closed": false`` and lost its rows.
    The middleware closes the recorder at the ASGI lifespan shutdown, before that happens;
    without a lifespan, the recipe's SIGTERM handler lets the ``finally`` run."""
    trace = tmp_path / "server-trace"
    with middleware_server(trace, "--lifespan", lifespan) as (url, proc):
        for i in range(3):
            _stream(url, f"r{i}")
        stop(proc, sig)
    t = open_trace(trace)
    assert t.meta.get("closed") is True
    assert sorted(t.table("requests").column("request_id").to_pylist()) == ["r0", "r1", "r2"]
    assert Counter(s["name"] for s in t.table("spans").to_pylist()) == {"server.request": 3}


def test_merge_keeps_the_client_tokens_when_the_server_recorded_none(tmp_path: Path) -> None:
    """Seen with llama-cpp-python's app wrapped in the middleware: the server trace had no token
    rows (its loop is not instrumented), and the joined trace had none either, so TTFT, ITL and
    TPOT were 'not measured' although the probe had 16 TTFTs and 732 ITLs."""
    server_dir, client_dir = tmp_path / "server", tmp_path / "client"
    with middleware_server(server_dir) as (url, proc):
        cfg = ProbeConfig(url=url, n=6, concurrency=2, max_tokens=8, model="m", out=client_dir,
                          progress=False)
        result = run_probe(cfg)
        assert sum(r.ok for r in result.results) == 6
        stop(proc, signal.SIGINT)
    assert open_trace(server_dir).rows("tokens") == 0
    merge_traces(client_dir, server_dir, tmp_path / "joined")
    joined = open_trace(tmp_path / "joined")
    tokens = joined.table("tokens").to_pylist()
    assert Counter(r["request_id"] for r in tokens) == {r.request_id: 8 for r in result.results}
    assert all(r["client_recv_ns"] is not None for r in tokens)
    doc = analyzers.analyze(tmp_path / "joined").to_json()
    assert doc["ttft_ms"]["n"] == 6 and doc["itl_ms"]["n"] == 6 * 7 and doc["tpot_ms"]["n"] == 6
    assert doc["components"]["network"]["measured"]
