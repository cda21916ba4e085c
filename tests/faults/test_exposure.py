"""Exposure review, tested: what listens where, what a request may ask, what --model may load, what runs.

* Every socket ``tracetool serve --live`` (and its live endpoint process) and the
  delay proxy listen on is on 127.0.0.1 by default (read from ``/proc``, not
  from our own log line).
* ``tracetool serve`` enforces each documented limit: body size (413, with and
  without a Content-Length), prompt and output length (400), waiting requests
  (503), and ``--max-queue 0`` still serves requests that find a free slot.
* ``--model`` loads only from a local directory: a hub id is one line, exit 3,
  and no outgoing connection is attempted (HF_HUB_OFFLINE unset).
* The SQL console's read-only guard holds against the tricks beyond
  ``tests/tui/test_queries.py``'s list (EXPLAIN ANALYZE, query(), globbing,
  extension autoloading, secrets).
* No pickle, eval/exec, unsafe YAML, ``torch.load`` or remote code in the product.

The live endpoint's token and TLS checks are tested in ``tests/live/test_access.py``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest

from tests.conftest import REPO
from tests.waiting import wait_until
from tracetool.serving.demo import server_process

MODEL = "tracetool-demo-llama"


# -- what listens --------------------------------------------------------------------------------------
def _descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += parents.get(p, [])
    return out


def _listening(pids: list[int]) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that one of ``pids`` holds open."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                m = re.match(r"socket:\[(\d+)\]", os.readlink(fd))
                if m:
                    inodes.add(m.group(1))
        except OSError:
            continue
    out = []
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            hexaddr, hexport = f[1].split(":")
            raw = bytes.fromhex(hexaddr)
            if name == "tcp":
                addr = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:
                addr = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
            out.append((addr, int(hexport, 16)))
    return out


def _loopback(addr: str) -> bool:
    """127.0.0.1, ::1, or 127.0.0.1 mapped into IPv6 (gRPC binds a dual-stack socket to it)."""
    ip = ipaddress.ip_address(addr)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


@pytest.mark.slow
def test_serve_and_its_live_endpoint_listen_on_loopback_only(tmp_path: Path) -> None:
    with server_process(tmp_path / "t", "--threads", "1", "--live", "0") as (url, proc):
        socks = _listening(_descendants(proc.pid))
        assert socks, "no listening socket found"
        assert len(socks) >= 2, f"expected the API and the live endpoint: {socks}"
        assert all(_loopback(addr) for addr, _ in socks), socks
        assert f":{socks[0][1]}" in url or any(f":{p}/" in url for _, p in socks)


def test_receive_listens_on_loopback_only(tmp_path: Path) -> None:
    from tests.otlp.conftest import start_receiver

    receiver = start_receiver(tmp_path / "t")
    try:
        socks = _listening(_descendants(receiver.proc.pid))
        ports = {int(receiver.match[k].rsplit(":", 1)[1]) for k in ("grpc", "http")}
        assert ports <= {p for _, p in socks}, (socks, receiver.match)
        assert all(_loopback(addr) for addr, _ in socks), socks
    finally:
        assert receiver.stop() == 0


def test_the_delay_proxy_listens_on_loopback(tmp_path: Path) -> None:
    from tracetool.serving.proxy import DelayProxy

    with DelayProxy(("127.0.0.1", 9), rtt_ms=1) as proxy:
        socks = _listening([os.getpid()])
        assert (proxy.host, proxy.port) in socks and proxy.host == "127.0.0.1"


def test_no_command_binds_beyond_loopback_by_default() -> None:
    """Every --host/--live option of every command defaults to loopback (or to nothing)."""
    import click

    from tracetool.cli import COMMANDS, cli

    ctx = click.Context(cli)
    for name in COMMANDS:
        cmd = cli.get_command(ctx, name)
        assert cmd is not None
        for p in cmd.params:
            if p.name in ("host", "live", "bind", "listen"):
                assert p.default in (None, "127.0.0.1", "localhost"), (name, p.name, p.default)
            if p.name in ("grpc_addr", "http_addr"):  # tracetool receive's HOST:PORT options
                assert str(p.default).startswith("127.0.0.1:"), (name, p.name, p.default)


# -- serve's limits --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    trace = tmp_path_factory.mktemp("limited") / "t"
    with server_process(trace, "--threads", "1", "--max-batch", "1", "--max-queue", "1",
                        "--max-prompt-tokens", "32", "--max-body-bytes", "4096") as (url, _proc):
        yield url


def _err(r: httpx.Response) -> dict[str, Any]:
    return dict(r.json()["error"])


@pytest.mark.slow
def test_body_size_limit_is_413_with_or_without_content_length(limited: str) -> None:
    big = json.dumps({"model": MODEL, "prompt": "x" * 5000}).encode()
    r = httpx.post(f"{limited}/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and _err(r)["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is counted as the body streams in
        yield b'{"model": "' + MODEL.encode() + b'", "prompt": "'
        for _ in range(64):
            yield b"y" * 1024
        yield b'"}'

    r = httpx.post(f"{limited}/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and _err(r)["code"] == "request_too_large"


@pytest.mark.slow
def test_prompt_and_output_length_limits_are_400(limited: str) -> None:
    r = httpx.post(f"{limited}/completions", json={"model": MODEL, "prompt": " word" * 200, "max_tokens": 2})
    assert r.status_code == 400 and "limit" in _err(r)["message"]
    r = httpx.post(f"{limited}/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1025})
    assert r.status_code == 400 and _err(r)["param"] == "max_tokens"
    r = httpx.post(f"{limited}/completions", json={"model": MODEL, "prompt": [5] * 33, "max_tokens": 2})
    assert r.status_code == 400  # token-id prompts count too


@pytest.mark.slow
def test_requests_beyond_the_queue_get_503(limited: str) -> None:
    """1 running (--max-batch 1) + 1 waiting (--max-queue 1): the third is refused, then served again."""
    body = {"model": MODEL, "prompt": "the river", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as a, httpx.Client(timeout=60) as b:
        with a.stream("POST", f"{limited}/completions", json=body) as running:
            lines = running.iter_lines()  # kept: a dropped iterator closes the stream (and cancels it)
            next(lines)  # the first request is being decoded
            def wait_in_queue() -> None:
                with b.stream("POST", f"{limited}/completions", json={**body, "max_tokens": 40}) as waiting:
                    for _ in waiting.iter_lines():
                        pass

            th = threading.Thread(target=wait_in_queue, daemon=True)
            th.start()
            health = f"{limited.removesuffix('/v1')}/health"
            wait_until(lambda: httpx.get(health).json() == {"status": "ok", "active": 1, "waiting": 1},
                       "the server's /health to say one request runs and one waits")
            r = httpx.post(f"{limited}/completions", json={**body, "stream": False})
            assert r.status_code == 503 and _err(r)["code"] == "overloaded"
        th.join(60)  # closing the first stream cancelled it; the waiting one ran to its end
    r = httpx.post(f"{limited}/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200


def test_max_queue_zero_still_serves_requests_that_find_a_free_slot(tmp_path: Path) -> None:
    from collectors import Recorder
    from collectors.demo import load_demo_model
    from tracetool.serving.engine import Engine, GenRequest, Overloaded

    model, tok = load_demo_model(seed=0, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=2, head_dim=32, intermediate_size=128)
    rec = Recorder(tmp_path / "t").start()
    engine = Engine(model, tok, rec, max_batch=1, max_waiting=0).start()
    hold, done = threading.Event(), threading.Event()

    def first(ev: tuple[Any, ...]) -> None:
        if ev[0] == "token":
            hold.wait(30)  # keeps the only slot busy until the test says so
        elif ev[0] in ("done", "error"):
            done.set()

    try:
        engine.submit(GenRequest(rec.request("a"), [1, 2, 3], 2, first, ignore_eos=True))  # a free slot
        wait_until(lambda: engine.load == (1, 0), "the first request in the only slot")
        with pytest.raises(Overloaded):
            engine.submit(GenRequest(rec.request("b"), [1, 2, 3], 2, lambda ev: None))
        hold.set()
        assert done.wait(30)
        wait_until(lambda: engine.load == (0, 0), "the slot free again")
        engine.submit(GenRequest(rec.request("c"), [1, 2, 3], 2, lambda ev: None))  # the slot is free again
    finally:
        hold.set()
        engine.close()
        rec.close()


# -- --model loads local directories only ------------------------------------------------------------------
@pytest.fixture
def no_connect(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record (and refuse) every outgoing connection attempt of this process."""
    attempts: list[Any] = []
    real_connect = socket.socket.connect

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args[1:] if len(args) > 1 else args)
        raise OSError("test: outgoing connections are refused")

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family == socket.AF_UNIX:
            return real_connect(self, address)
        return refuse(self, address)

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    return attempts


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B", "gpt2", "hf://org/model"])
def test_serve_refuses_a_hub_id_without_touching_the_network(model: str, cli: Any, tmp_path: Path,
                                                              no_connect: list[Any], monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    r = cli("serve", "--model-dir", model, "--port", 0, "-o", tmp_path / "t")
    assert r.code == 3, r.err
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "never downloads" in lines[0], r.err
    assert no_connect == [], f"connection attempts: {no_connect}"


def test_a_local_directory_without_weights_is_not_completed_from_the_hub(cli: Any, tmp_path: Path,
                                                                          no_connect: list[Any]) -> None:
    d = tmp_path / "Llama-3.1-8B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                               "_name_or_path": "meta-llama/Llama-3.1-8B"}))
    r = cli("serve", "--model-dir", d, "--port", 0, "-o", tmp_path / "t")
    assert r.code == 3, r.err
    assert len([ln for ln in r.err.splitlines() if ln.startswith("tracetool: error:")]) == 1, r.err
    assert "Traceback" not in r.err
    assert no_connect == [], f"connection attempts: {no_connect}"


# -- the SQL console ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def console_view() -> Any:
    from analyzers.options import AnalysisOptions
    from tracetool.trace_source import DirectorySource
    from tracetool.tui.model import analyse

    return analyse(DirectorySource((REPO / "sample_traces" / "chat",)), AnalysisOptions(), generation=1).view(None)


@pytest.mark.parametrize("sql", [
    "EXPLAIN ANALYZE COPY tokens TO '{tmp}/out.csv'",
    "EXPLAIN ANALYZE SELECT * FROM read_text('/etc/hostname')",
    "SELECT * FROM query('COPY tokens TO ''{tmp}/out2.csv''')",
    "SELECT * FROM glob('/etc/*')",
    "SELECT * FROM read_blob('/etc/hostname')",
    "WITH x AS (SELECT * FROM read_parquet('{trace}/tokens.parquet')) SELECT count(*) FROM x",
    "FROM '{trace}/tokens.parquet'",
    "SUMMARIZE SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM sniff_csv('/etc/passwd')",
    "SELECT * FROM sqlite_scan('{tmp}/x.db', 't')",
    "SELECT * FROM duckdb_secrets()",
    "PRAGMA version",
    "CALL pragma_version()",
    "CHECKPOINT",
    "USE memory",
])
def test_console_reads_nothing_outside_the_trace_and_writes_nothing(console_view: Any, sql: str,
                                                                     tmp_path: Path) -> None:
    from tracetool.tui.queries import ConsoleRefused, run_console

    with pytest.raises(ConsoleRefused) as info:
        run_console(console_view, sql.format(tmp=tmp_path, trace=REPO / "sample_traces" / "chat"))
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []
    assert run_console(console_view, "SELECT current_setting('enable_external_access')").rows == [(False,)]


# -- no code from data ---------------------------------------------------------------------------------------
PACKAGES = ("tracetool", "collectors", "analyzers")
FORBIDDEN = [
    (re.compile(r"\bimport\s+(c?pickle|dill|shelve|marshal)\b|\bfrom\s+(c?pickle|dill|shelve|marshal)\s+import"),
     "pickle-like deserialisation"),
    (re.compile(r"(?<![\w.])(eval|exec)\s*\("), "eval/exec"),
    (re.compile(r"yaml\.(unsafe_)?load\s*\((?![^)]*SafeLoader)"), "yaml.load without SafeLoader"),
    (re.compile(r"torch\.load\s*\((?![^)]*weights_only\s*=\s*True)"), "torch.load without weights_only=True"),
    (re.compile(r"trust_remote_code\s*=\s*True"), "trust_remote_code=True"),
    (re.compile(r"\bpd\.read_pickle|\bnp\.load\s*\([^)]*allow_pickle\s*=\s*True"), "pickle through pandas/numpy"),
    (re.compile(r"subprocess\.[A-Za-z_]+\([^)]*shell\s*=\s*True"), "a shell command line"),
]
def test_no_pickle_eval_or_remote_code_in_the_product() -> None:
    hits = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                code = line.split("#", 1)[0]
                for pattern, what in FORBIDDEN:
                    if pattern.search(code):
                        hits.append(f"{path.relative_to(REPO)}:{n}: {what}: {line.strip()}")
    assert not hits, "review these (and list them in REVIEWED with why):\n" + "\n".join(hits)


def test_the_grep_finds_what_it_looks_for() -> None:
    """The patterns are not vacuous: each matches the line it is meant to catch."""
    samples = ["import pickle", "from dill import loads", "x = eval(s)", "exec(code)", "yaml.load(f)",
               "torch.load(p)", "AutoModel.from_pretrained(p, trust_remote_code=True)", "pd.read_pickle(p)",
               "subprocess.run(cmd, shell=True)"]
    for s in samples:
        assert any(p.search(s) for p, _ in FORBIDDEN), s
    for ok in ["yaml.load(f, Loader=yaml.SafeLoader)", "torch.load(p, weights_only=True)", "model.eval()",
               "self.evaluate(x)", "literal_eval(s)"]:
        assert not any(p.search(ok) for p, _ in FORBIDDEN), ok


def test_demo_and_serve_processes_do_not_inherit_secrets_on_their_command_line(tmp_path: Path) -> None:
    """A live token given to `record` reaches the program through its environment, not argv (ps shows argv)."""
    script = tmp_path / "argv.py"
    script.write_text("import sys, json, os; print(json.dumps(sys.argv)); "
                      "print(os.environ.get('TRACETOOL_LIVE_TOKEN', ''))")
    r = subprocess.run([sys.executable, "-m", "tracetool", "record", "-o", str(tmp_path / "t"), "--live", "0",
                        "--live-token", "s3cret-token", "--", sys.executable, str(script)],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    argv_line, token_line = r.stdout.strip().splitlines()[:2]
    assert "s3cret-token" not in argv_line and token_line == "s3cret-token"
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    assert "s3cret-token" not in json.dumps(meta), "the token was written into the trace"


# -- what a trace holds: no prompt or output text ---------------------------------------------------------
SECRET_PROMPT = "zebra quartz saffron lantern 7781"
#: what must not appear in a trace: the prompt's words (not its number alone: "7781" turned up inside
#: a random 19-digit id in one run)
SECRET_WORDS = ("zebra", "quartz", "saffron", "lantern 7781")


def _strings_of(trace: Path) -> str:
    """Every string value of every table (decompressed), and meta.json: what a trace gives away."""
    from tracetool.reader import open_trace

    t = open_trace(trace)
    parts = [(trace / "meta.json").read_text()]
    for table in t.tables.values():
        for col in table.columns:
            if col.type in (pa.string(), pa.large_string()):
                parts += [v for v in col.to_pylist() if v]
    return "\n".join(parts)


def test_no_prompt_or_output_text_in_a_probe_trace(cli: Any, tmp_path: Path) -> None:
    from tests.faults.hostile_server import HostileServer

    prompts = tmp_path / "prompts.txt"
    prompts.write_text(SECRET_PROMPT + "\n")
    with HostileServer("secret-output") as srv:
        r = cli("probe", srv.url, "-n", 2, "--prompt-file", prompts, "-q", "-o", tmp_path / "t")
    assert r.code == 0, r.err
    text = _strings_of(tmp_path / "t")
    assert "s3cr3t" not in text and "0utput" not in text and "t3xt" not in text
    assert not [w for w in SECRET_WORDS if w in text]
    assert "prompts.txt" in text  # the prompt file's path is there (meta.json probe block): say so in the docs


def test_no_prompt_or_output_text_in_a_server_or_generate_trace(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    import copy

    import torch

    from collectors import Recorder
    from collectors.hf import instrument_hf, unwrap_generate, unwrap_tokenizer
    from collectors.torch_hooks import uninstrument
    from tests.faults.serve_app import App

    app = App(tiny, tmp_path / "serve")
    try:
        body = {"model": "m", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        a = httpx.post(f"{app.url}/completions", json={**body, "prompt": SECRET_PROMPT}, timeout=60)
        c = httpx.post(f"{app.url}/chat/completions", timeout=60,
                       json={**body, "messages": [{"role": "user", "content": SECRET_PROMPT}]})
        assert a.status_code == c.status_code == 200
        outputs = [a.json()["choices"][0]["text"], c.json()["choices"][0]["message"]["content"]]
    finally:
        app.close()
    model, tok = copy.deepcopy(tiny[0]), copy.deepcopy(tiny[1])
    rec = Recorder(tmp_path / "hf").start()
    instrument_hf(model, tok, rec)
    try:
        with torch.inference_mode():
            enc = tok([SECRET_PROMPT], return_tensors="pt")
            out = model.generate(**enc, max_new_tokens=12, min_new_tokens=12, do_sample=False)
        outputs += tok.batch_decode(out[:, enc["input_ids"].shape[1]:])
    finally:
        rec.close()
        unwrap_generate(model)
        unwrap_tokenizer(tok)
        uninstrument(model)
    for trace in (tmp_path / "serve", tmp_path / "hf"):
        text = _strings_of(trace)
        assert not [w for w in SECRET_WORDS if w in text], trace
        for o in outputs:
            assert len(o.strip()) < 8 or o.strip() not in text, (trace, o)
