"""Fixtures for the OTLP tests: a real `tracetool receive` child, the vLLM-shaped server, SDK spans.

Children listen on free loopback ports (port 0) and are awaited by reading the
line each prints when it accepts connections, never by sleeping; teardown
stops them (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
READY = re.compile(r"receiving OTLP traces on (?:grpc (?P<grpc>\S+))?(?: and )?(?:http://(?P<http>[^/\s]+)/v1/traces)?")


@dataclass
class Child:
    """A child process whose output is read on a thread (lines kept), ready once ``ready`` is set."""

    proc: subprocess.Popen[str]
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=2000))
    ready: threading.Event = field(default_factory=threading.Event)
    match: dict[str, str] = field(default_factory=dict)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def start_child(cmd: list[str], ready: Callable[[str], dict[str, str] | None], *, stream: str = "stderr",
                env: dict[str, str] | None = None, timeout_s: float = 60.0) -> Child:
    """Start ``cmd``; wait for the first line of ``stream`` that ``ready`` accepts."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    full_env.update(env or {})
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, text=True, env=full_env,
                            stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    child = Child(proc)

    def drain(f: Any, watch: bool) -> None:
        for line in f:
            child.lines.append(line.rstrip("\n"))
            if watch and not child.ready.is_set():
                m = ready(line)
                if m is not None:
                    child.match.update(m)
                    child.ready.set()
        if watch:
            child.ready.set()

    threading.Thread(target=drain, args=(proc.stderr, stream == "stderr"), daemon=True).start()
    if stream == "stdout":
        threading.Thread(target=drain, args=(proc.stdout, True), daemon=True).start()
    child.ready.wait(timeout_s)
    if not child.match:
        child.stop(signal.SIGKILL)
        raise RuntimeError(f"{' '.join(cmd)} did not start:\n{child.text[-3000:]}")
    return child


def start_receiver(out: Path, *extra: str) -> Child:
    """``tracetool receive`` on free loopback ports; ``match`` has ``grpc`` and ``http`` HOST:PORT."""
    cmd = [sys.executable, "-m", "tracetool", "receive", "-o", str(out), "--otlp-grpc", "127.0.0.1:0",
           "--otlp-http", "127.0.0.1:0", *extra]

    def ready(line: str) -> dict[str, str] | None:
        m = READY.search(line)
        return {k: v for k, v in m.groupdict().items() if v} if m else None

    return start_child(cmd, ready)


def start_vllm_shaped(protocol: str, endpoint: str, truth: Path) -> Child:
    """The vLLM-shaped test server exporting to ``endpoint`` with ``protocol`` (grpc or http/protobuf)."""
    cmd = [sys.executable, str(HERE / "vllm_shaped_server.py"), "--otlp-traces-endpoint", endpoint,
           "--truth", str(truth)]

    def ready(line: str) -> dict[str, str] | None:
        return {"port": line.split()[1]} if line.startswith("ready ") else None

    # the server knows nothing of tracetool: it runs without the repository on its path
    env = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": protocol, "PYTHONPATH": ""}
    return start_child(cmd, ready, stream="stdout", env=env)


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Children started by a test, stopped in teardown whatever happened."""
    started: list[Child] = []
    yield started
    for c in started:
        if c.proc.poll() is None:
            c.stop(signal.SIGKILL)
