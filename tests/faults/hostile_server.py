"""A test-only HTTP server that misbehaves at the socket level, for the probe's fault tests.

``tests/serving/fakes.py`` covers malformed but polite responses (bad JSON,
HTTP 500, a hang after the request). This one covers what a broken or hostile
peer does to a client: closing at once, resetting mid-stream, answering with
bytes that are not HTTP, dripping a byte at a time forever, sending an
endless error body or event line, nesting JSON thousands deep, or reporting
timings that are not finite numbers. Real sockets on a loopback port, in a
background thread; nothing is mocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
from typing import Any

MODELS = json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]}).encode()


def chunk(text: str, **extra: Any) -> bytes:
    event = {"id": "x", "object": "chat.completion.chunk", "model": "fake",
             "choices": [{"index": 0, "delta": {"content": text}}], **extra}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def finish(text: str, reason: str = "length") -> bytes:
    """The last content chunk of an answer, with its finish_reason (real servers always send one)."""
    event = {"id": "x", "object": "chat.completion.chunk", "model": "fake",
             "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": reason}]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"


class HostileServer:
    """``with HostileServer("drip") as s: s.url`` -> http://127.0.0.1:PORT/v1.

    ``models`` says how GET /v1/models behaves (``ok``, ``drip``, ``garbage``, ``endless``).
    """

    def __init__(self, behaviour: str, models: str = "ok") -> None:
        self.behaviour = behaviour
        self.models = models
        self.port = 0
        self.requests = 0
        self.posts = 0
        #: bytes this server pushed to clients (an endless body is bounded by the client, not us)
        self.sent = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hostile-server")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> HostileServer:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            server.close()
            tasks = asyncio.all_tasks(loop)
            for t in tasks:
                t.cancel()
            if tasks:
                loop.run_until_complete(asyncio.wait(tasks))
            loop.close()

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        self.sent += len(data)
        await writer.drain()

    async def _endless(self, writer: asyncio.StreamWriter, piece: bytes) -> None:
        while True:  # until the client goes away (drain raises) or the test ends
            await self._write(writer, piece)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.behaviour.startswith("pooled-"):
            return await self._keep_alive(reader, writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, _path = lines[0].split()[:2]
            length = next((int(ln.split(":", 1)[1]) for ln in lines if ln.lower().startswith("content-length:")), 0)
            if length:
                await reader.readexactly(length)
            self.requests += 1
            if method == "GET":
                await self._models(writer)
            else:
                await self._post(writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _keep_alive(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Keep-alive connections that the server closes when the client sends a second request on
        one, without answering it (llama.cpp's llama-server closes a connection after a stream; a
        client that reuses it first hears of it there). ``pooled-close``: the first request on each
        connection is answered. ``pooled-close-then-refuse``: only the server's first request is;
        every later one, on any connection, is closed unanswered (a real failure)."""
        on_this = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method = lines[0].split()[0]
                length = next((int(ln.split(":", 1)[1]) for ln in lines
                               if ln.lower().startswith("content-length:")), 0)
                if length:
                    await reader.readexactly(length)
                self.requests += 1
                if method == "GET":
                    return await self._models(writer)
                on_this += 1
                self.posts += 1
                refuse = on_this > 1 or (self.behaviour == "pooled-close-then-refuse" and self.posts > 1)
                if refuse:
                    return  # close without a byte of response
                body = chunk("a") + finish("b") + b"data: [DONE]\n\n"
                await self._write(writer, b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                                          b"transfer-encoding: chunked\r\n\r\n"
                                  + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _models(self, writer: asyncio.StreamWriter) -> None:
        if self.models == "drip":
            await self._write(writer, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                      b"content-length: 1000000\r\n\r\n")
            while True:
                await self._write(writer, b" ")
                await asyncio.sleep(0.05)
        elif self.models == "garbage":
            await self._write(writer, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 9\r\n"
                                      b"connection: close\r\n\r\n{\"data\":7")
        elif self.models == "endless":
            await self._write(writer, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                      b"transfer-encoding: chunked\r\n\r\n")
            piece = b"[" * 65536
            await self._endless(writer, b"%x\r\n%s\r\n" % (len(piece), piece))
        else:
            await self._write(writer, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                              + str(len(MODELS)).encode() + b"\r\nconnection: close\r\n\r\n" + MODELS)

    async def _post(self, writer: asyncio.StreamWriter) -> None:
        b = self.behaviour
        if b == "close-at-once":
            return
        if b == "reset-mid-stream":
            await self._write(writer, SSE_HEAD + chunk("a"))
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            writer.transport.abort()
        elif b == "garbage-http":
            await self._write(writer, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not HTTP at all \xff\xfe\r\n\r\n")
        elif b == "stall-mid-stream":
            await self._write(writer, SSE_HEAD + chunk("a"))
            await asyncio.sleep(3600)
        elif b == "drip":  # a keep-alive comment byte every 50 ms: no read ever times out
            await self._write(writer, SSE_HEAD + chunk("a"))
            while True:
                await self._write(writer, b":")
                await asyncio.sleep(0.05)
        elif b == "endless-error-body":
            await self._write(writer, b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
                                      b"transfer-encoding: chunked\r\n\r\n")
            piece = b"x" * 65536
            await self._endless(writer, b"%x\r\n%s\r\n" % (len(piece), piece))
        elif b == "endless-not-sse":
            await self._write(writer, b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n")
            await self._endless(writer, b"y" * 65536)
        elif b == "endless-line":
            await self._write(writer, SSE_HEAD + chunk("a") + b"data: ")
            await self._endless(writer, b"z" * 65536)
        elif b == "deep-json":
            await self._write(writer, SSE_HEAD + chunk("a") + b"data: " + b"[" * 20000 + b"]" * 20000 + b"\n\n")
        elif b == "nonfinite-timing":
            # huge and non-finite durations in the header and the final event: the rest must survive
            await self._write(writer, b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                                      b"server-timing: server;dur=1e999, queue;dur=nan, prefill;dur=-5\r\n"
                                      b"connection: close\r\n\r\n" + chunk("a") + finish("b")
                              + b'data: {"choices": [], "usage": {"completion_tokens": 2}, "server_timing": '
                              + b'{"server": 1' + b"0" * 400 + b', "decode": 1e400, "queue": -1}}\n\n'
                              + b"data: [DONE]\n\n")
        elif b == "secret-output":  # a well-behaved stream whose text must never reach a trace
            await self._write(writer, SSE_HEAD + chunk("s3cr3t-") + chunk("0utput-") + finish("t3xt")
                              + b'data: {"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 5}}\n\n'
                              + b"data: [DONE]\n\n")
        else:
            raise AssertionError(f"unknown behaviour {b}")
