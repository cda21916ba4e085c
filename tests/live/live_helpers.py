"""Helpers for the live tests: recorders streaming synthetic tokens, clients that count what arrives.

Everything runs in-process on loopback ports picked by the OS (``127.0.0.1:0``),
except where a test needs a process it can kill. Waits are on conditions the
callbacks signal (:class:`Received`), or else on what the code exposes with
:func:`tests.waiting.wait_until` (re-exported here), with deadlines generous for
a loaded 2-core machine; none is a bare sleep.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from collectors.recorder import Recorder
from tests.waiting import TIMEOUT_S as DEADLINE_S
from tests.waiting import wait_until as wait_until
from tracetool.live.client import ClientOptions, ServerConnection
from tracetool.live.protocol import Address


def free_port() -> int:
    """A port free right now (for a server the test must restart on the same port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def history_sent(rec: Recorder) -> bool:
    """A viewer is connected and the endpoint sent it every table's history (its ``stats``)."""
    stats = rec.live.stats()
    return bool(stats["viewers"]) and all(t["sent_rows"] >= t["history_rows"] for t in stats["tables"].values())


def endpoint_holds_what_was_written(rec: Recorder) -> bool:
    """After ``rec.writer.flush()``: the endpoint's history holds every row the writer wrote to disk
    (the rows reach it through the sidecar's forwarder and process, after the file)."""
    tables = rec.live.stats()["tables"]
    return all(t["rows"] == recorded_rows(rec.writer.directory, name) for name, t in tables.items())


def recorded_rows(path: Path, table: str) -> int:
    """The complete rows of ``table`` in a recording being written (0 before its file exists)."""
    from tracetool.errors import BadInput
    from tracetool.reader import open_trace

    try:
        return open_trace(path, tables=[table]).rows(table)
    except BadInput:  # not a trace yet: no meta.json, no table file
        return 0


def stop_process(p: subprocess.Popen[str], sig: int) -> tuple[str, str]:
    """Send ``sig`` to a running ``tracetool`` child and collect its (stdout, stderr); kill it if it hangs."""
    try:
        p.send_signal(sig)
        return p.communicate(timeout=DEADLINE_S)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


class Received:
    """What a :class:`ServerConnection` hands over, with a condition to wait on."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.batches: dict[str, list[pa.RecordBatch]] = {}
        self.hellos: list[tuple[dict[str, Any], bool]] = []

    def on_hello(self, conn: ServerConnection, hello: dict[str, Any], new: bool) -> None:
        with self.cond:
            self.hellos.append((hello, new))
            self.cond.notify_all()

    def on_batch(self, conn: ServerConnection, table: str, batch: pa.RecordBatch) -> None:
        with self.cond:
            self.batches.setdefault(table, []).append(batch)
            self.cond.notify_all()

    def rows(self, table: str) -> int:
        return sum(b.num_rows for b in self.batches.get(table, []))

    def table(self, table: str) -> pa.Table:
        return pa.Table.from_batches(self.batches.get(table, []))

    def wait(self, test: Callable[[Received], bool], what: str, deadline: float = DEADLINE_S) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: test(self), timeout=deadline):
                raise AssertionError(f"timed out waiting for {what} (tokens received: {self.rows('tokens')})")


def connect(address: Address, options: ClientOptions | None = None) -> tuple[ServerConnection, Received]:
    got = Received()
    conn = ServerConnection(address, got.on_hello, got.on_batch,
                            options or ClientOptions(backoff_s=0.1, backoff_max_s=0.5)).start()
    return conn, got


def produce(rec: Recorder, requests: int, tokens: int, prefix: str = "r", pause_s: float = 0.0) -> None:
    """Synthetic traffic: each request a server.request span around decode, ``tokens`` tokens."""
    for k in range(requests):
        with rec.request(f"{prefix}{k}", prompt_tokens=8) as req:
            with req.span("server.request"):
                with req.span("prefill"):
                    pass
                with req.span("decode"):
                    for i in range(tokens):
                        req.token(i, kv_len=8 + i)
            req.output_tokens = tokens
        if pause_s:
            time.sleep(pause_s)


class Traffic:
    """A thread producing requests until stopped (a server under load)."""

    def __init__(self, rec: Recorder, tokens: int = 20, pause_s: float = 0.002, prefix: str = "t") -> None:
        self.rec = rec
        self._stop = threading.Event()
        self.requests = 0
        self._t = threading.Thread(target=self._run, args=(tokens, pause_s, prefix), daemon=True)

    def _run(self, tokens: int, pause_s: float, prefix: str) -> None:
        while not self._stop.is_set():
            produce(self.rec, 1, tokens, prefix=f"{prefix}{self.requests}-")
            self.requests += 1
            self._stop.wait(pause_s)

    def __enter__(self) -> Traffic:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(10)
