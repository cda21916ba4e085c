"""A loopback TCP proxy that adds a known round-trip time: a slow link on one machine.

    with DelayProxy(("127.0.0.1", 8000), rtt_ms=80) as proxy:
        probe(f"http://127.0.0.1:{proxy.port}")   # every byte takes 40 ms each way

Why: "it's the network" has to be testable. Tests and the sample-trace recipes
put this proxy between ``tracetool probe`` and a server and check that the
added RTT comes out as ``network`` time and nowhere else. ``tc netem`` would
do the same for the whole loopback interface, needs root, and would slow every
other process on the machine.

Each direction is a delay line: every chunk read is written out one-way delay
(``rtt_ms / 2``, plus optional jitter) after it arrived, chunks keep their
order and their spacing, so a token stream keeps its inter-token gaps. A
userspace proxy cannot delay the TCP handshake itself (the kernel accepts the
connection), so a client's connect time through it measures the loopback, not
the added delay; the first bytes of every request do pay it.

Run standalone: ``python -m tracetool.serving.proxy --upstream 127.0.0.1:8000 --rtt-ms 80``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import socket
import sys
import threading
import time
from typing import Any

from tracetool.untrusted import echo

_CHUNK = 1 << 16


class DelayProxy:
    """Forward ``host:port`` → ``upstream`` adding ``rtt_ms`` of round trip (half each way).

    Args:
        upstream: (host, port) to forward to.
        rtt_ms: added round-trip time in milliseconds.
        jitter_ms: extra one-way delay drawn uniformly from [0, jitter_ms) per chunk
            (order is kept, so a late chunk also delays the ones behind it).
        host, port: where to listen (port 0: pick a free one, see :attr:`port`).
        seed: seeds the jitter.
    """

    def __init__(self, upstream: tuple[str, int], *, rtt_ms: float, jitter_ms: float = 0.0,
                 host: str = "127.0.0.1", port: int = 0, seed: int = 0) -> None:
        if rtt_ms < 0 or jitter_ms < 0:
            raise ValueError("rtt_ms and jitter_ms must be >= 0")
        self.upstream = upstream
        self.one_way_s = rtt_ms / 2000.0
        self.jitter_s = jitter_ms / 1000.0
        self.host = host
        self.port = port
        self.connections = 0
        self._rng = random.Random(seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- lifecycle (a background thread with its own event loop) -------------------------
    def start(self) -> DelayProxy:
        """Listen and forward on a background thread; returns once listening."""
        self._thread = threading.Thread(target=self._run, name="tracetool-delay-proxy", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise OSError(f"delay proxy could not listen on {self.host}:{self.port}: {self._error}")
        return self

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(self._stop)
        if self._thread is not None:
            self._thread.join(10)

    def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        assert self._loop is not None
        self._loop.call_later(0.05, self._loop.stop)

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._handle, self.host, self.port))
            self.port = self._server.sockets[0].getsockname()[1]
        except BaseException as e:
            self._error = e
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def serve_forever(self, on_listen: Any = None) -> None:
        """Run in the caller's event loop until cancelled (the standalone entry point)."""
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        if on_listen is not None:
            on_listen()
        async with self._server:
            await self._server.serve_forever()

    # -- one connection ----------------------------------------------------------------------
    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self.connections += 1
        _nodelay(c_writer)
        try:
            u_reader, u_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            c_writer.close()
            return
        _nodelay(u_writer)
        try:
            await asyncio.gather(self._pipe(c_reader, u_writer), self._pipe(u_reader, c_writer))
        except (asyncio.CancelledError, OSError):
            pass
        finally:
            for w in (c_writer, u_writer):
                with contextlib.suppress(Exception):
                    w.close()
            if task is not None:
                self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A delay line: read chunks as they come, write each one-way delay after its arrival."""
        line: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await line.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    with contextlib.suppress(OSError):
                        if writer.can_write_eof():
                            writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        last_due = 0.0
        try:
            while True:
                try:
                    data = await reader.read(_CHUNK)
                except (ConnectionError, OSError):
                    data = b""
                due = time.monotonic() + self.one_way_s
                if self.jitter_s:
                    due += self._rng.random() * self.jitter_s
                last_due = due = max(due, last_due)  # keep the order of the bytes
                line.put_nowait((due, data))
                if not data:
                    break
            await sender
        except asyncio.CancelledError:
            sender.cancel()
            raise
        except (ConnectionError, OSError):
            sender.cancel()


def _nodelay(writer: asyncio.StreamWriter) -> None:
    # Nagle + delayed ACK would add up to 40 ms on its own: the only delay here must be ours
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tracetool.serving.proxy",
                                description="Loopback TCP proxy adding a known round-trip time.")
    p.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    p.add_argument("--rtt-ms", type=float, required=True, help="added round-trip time, ms")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="extra one-way delay, uniform [0, J) ms")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: pick a free port (printed on stderr)")
    a = p.parse_args(argv)
    host, _, port = a.upstream.rpartition(":")
    if not host or not port.isdigit():
        p.error("--upstream must be HOST:PORT")
    proxy = DelayProxy((host, int(port)), rtt_ms=a.rtt_ms, jitter_ms=a.jitter_ms, host=a.host, port=a.port)

    def say() -> None:
        echo(f"tracetool: delay proxy {proxy.url} -> {a.upstream} (+{a.rtt_ms:g} ms RTT)", err=True)

    try:
        asyncio.run(proxy.serve_forever(say))
    except KeyboardInterrupt:
        return 130
    except OSError as e:
        echo(f"tracetool: error: delay proxy: {e}", err=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
