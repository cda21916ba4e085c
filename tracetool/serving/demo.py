"""``tracetool demo``'s recording: serve the demo model, probe it, merge both traces.

What the command shows of the result (the analysis, the TUI) is the CLI's
(:mod:`tracetool.cli.demo_cmd`); this module only makes the trace.

The server runs as a child process (``tracetool serve --port 0``) so the
client's event loop and the server's engine do not share one interpreter
lock: on a small machine they would slow each other down and blur the very
split between network and server time the demo is about. The probe runs
here, optionally through a loopback delay proxy (``--rtt-ms``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from tracetool.errors import BadInput, UsageError
from tracetool.untrusted import shown

if TYPE_CHECKING:
    from tracetool.serving.probe_types import ProbeResult

READY_PREFIX = "tracetool: serving "

#: What the probe asks a real model (``--model smollm2`` or a directory): short questions with
#: short answers, so the demo shows coherent text stopping on EOS, not random words.
CHAT_PROMPTS = (
    "What is the capital of France?",
    "Name three primary colors.",
    "Say hello in Spanish.",
    "What is 12 times 12?",
    "Give one tip for sleeping well.",
    "What does a CPU do, in one sentence?",
    "Name a planet with rings.",
    "Write a haiku about rain.",
)


@dataclass
class DemoConfig:
    out: Path | None = None
    force: bool = False
    n: int = 16
    concurrency: int = 4
    prompt_tokens: int = 64
    max_tokens: int = 24
    rtt_ms: float = 0.0
    max_batch: int = 4
    start_timeout_s: float = 180.0
    #: None: the demo model; "smollm2": SmolLM2-135M-Instruct (collectors.demo.smollm2); else a
    #: local Hugging Face directory.
    model: str | None = None


@contextlib.contextmanager
def server_process(trace_dir: Path, *extra: str, timeout_s: float = 180.0,
                   stderr: TextIO | None = None) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Run ``tracetool serve --port 0`` in a child; yield (base URL, process) once it is ready.

    Readiness is the server's own "serving URL" line on stderr (printed after
    uvicorn accepts connections). On exit the child gets SIGTERM (it closes its
    trace), then SIGKILL if it has not stopped within 30 s.
    """
    cmd = [sys.executable, "-m", "tracetool", "serve", "--port", "0", "-o", str(trace_dir), "--force", *extra]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=env)
    tail: deque[str] = deque(maxlen=20)
    ready = threading.Event()
    url: list[str] = []

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            tail.append(line.rstrip())
            if not ready.is_set() and line.startswith(READY_PREFIX):
                url.append(line[len(READY_PREFIX):].split()[0])
                ready.set()
            elif stderr is not None and "error" in line.lower():
                stderr.write(shown(f"[server] {line.rstrip()}") + "\n")
        ready.set()  # EOF: the child ended

    reader = threading.Thread(target=drain, name="tracetool-demo-server-stderr", daemon=True)
    reader.start()
    try:
        ready.wait(timeout_s)
        if not url:
            why = "\n".join(tail) or "(no output)"
            state = f"exited with {proc.poll()}" if proc.poll() is not None else f"not ready after {timeout_s:g} s"
            raise BadInput(f"the demo server {state}:\n{why}")
        yield url[0], proc
    finally:
        stop_process(proc)
        reader.join(5)


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 30.0) -> int | None:
    """SIGTERM, wait, then SIGKILL: a child never outlives its parent's interest in it."""
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


@dataclass
class DemoRun:
    """What :func:`record_demo` made: the joined trace and what the probe saw."""

    out: Path
    probe: ProbeResult


def record_demo(cfg: DemoConfig, stderr: TextIO = sys.stderr) -> DemoRun:
    """Serve the model in a child process, probe it (through a delay proxy with ``rtt_ms``),
    and merge the client and server traces into ``cfg.out`` (a new temporary directory when
    None). Progress goes to ``stderr``.

    Raises:
        UsageError: a bad ``--model`` or a non-empty ``out`` without ``force``.
        BadInput: the server did not start.
    """
    from tracetool.merge import merge_traces
    from tracetool.reader import open_trace
    from tracetool.serving.probe import ProbeConfig, run_probe
    from tracetool.serving.proxy import DelayProxy
    from tracetool.writer.output import prepare_output

    model_dir = resolve_model(cfg.model, stderr)  # before anything is created: a usage error leaves nothing
    out = cfg.out or Path(tempfile.mkdtemp(prefix="tracetool-demo-"))
    prepare_output(out, cfg.force or cfg.out is None, create=False)
    work = Path(tempfile.mkdtemp(prefix="tracetool-demo-work-"))
    server_dir, client_dir = work / "server", work / "client"
    try:
        what = "demo model" if model_dir is None else model_dir.name
        stderr.write(f"tracetool: starting the demo server ({what}, loopback, free port)...\n")
        stderr.flush()
        extra: tuple[str, ...] = ("--threads", "1", "--max-batch", str(cfg.max_batch))
        prompts: Path | None = None
        if model_dir is not None:
            extra += ("--model-dir", str(model_dir))
            prompts = work / "prompts.txt"
            prompts.write_text("\n".join(CHAT_PROMPTS) + "\n", encoding="utf-8")
        with server_process(server_dir, *extra, timeout_s=cfg.start_timeout_s, stderr=stderr) as (url, _), \
                contextlib.ExitStack() as stack:
            if cfg.rtt_ms > 0:
                host, port = _host_port(url)
                proxy = stack.enter_context(DelayProxy((host, port), rtt_ms=cfg.rtt_ms))
                url = f"{proxy.url}/v1"
                stderr.write(f"tracetool: probing through a delay proxy adding {cfg.rtt_ms:g} ms RTT\n")
            # the demo model's gibberish would stop at random: ask it for exactly max_tokens; a real
            # model answers real questions and stops on EOS, as in production
            pcfg = ProbeConfig(url=url, n=cfg.n, concurrency=cfg.concurrency, prompt_tokens=cfg.prompt_tokens,
                               prompt_file=prompts, max_tokens=cfg.max_tokens, ignore_eos=model_dir is None,
                               out=client_dir, progress=True)
            result = run_probe(pcfg)
        if open_trace(server_dir).meta.get("closed") is not True:
            stderr.write("tracetool: the demo server did not close its trace cleanly; "
                         "what it flushed is merged\n")
        merge_traces(client_dir, server_dir, out, force=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stderr.write(f"tracetool: demo trace written to {out}\n")
    stderr.flush()
    return DemoRun(out=out, probe=result)


def resolve_model(model: str | None, stderr: TextIO) -> Path | None:
    """The directory ``tracetool serve --model`` gets: None for the demo model, SmolLM2's
    rebuilt directory for ``smollm2`` (built once, see :mod:`collectors.demo.smollm2`), or a
    local Hugging Face directory. Raises :class:`UsageError` with one line otherwise."""
    if model is None or model == "demo":
        return None
    from collectors.demo import smollm2

    if model.lower() == smollm2.ALIAS:
        def log(line: str) -> None:
            stderr.write(f"tracetool: {line}\n")
            stderr.flush()

        try:
            return smollm2.model_dir(log)
        except OSError as e:
            raise BadInput(f"cannot build {smollm2.NAME} in the cache ({e.strerror or e})") from e
    path = Path(model)
    if not (path / "config.json").is_file():
        raise UsageError(f"--model {model!r}: expected 'demo', '{smollm2.ALIAS}' or a local Hugging Face "
                         "model directory (with a config.json)")
    return path


def _host_port(url: str) -> tuple[str, int]:
    hostport = url.split("://", 1)[1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    return host.strip("[]"), int(port)
