"""Test-only HTTP servers that misbehave on purpose (malformed SSE, hangs, HTTP errors).

A raw asyncio server on a loopback port in a background thread: it answers
GET /v1/models like an OpenAI server and POSTs with whatever ``behaviour``
says, so the probe's error handling meets real sockets, not mocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from typing import Any

MODELS = json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]}).encode()


def _chunk(text: str, finish_reason: str | None = None) -> bytes:
    return b"data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "model": "fake",
                                   "choices": [{"index": 0, "delta": {"content": text},
                                                "finish_reason": finish_reason}]}).encode() + b"\n\n"


BEHAVIOURS: dict[str, bytes] = {
    # one good token, then an event that is not JSON
    "bad-json": _chunk("hi") + b"data: {not json at all\n\n",
    # plain text where events should be, never a [DONE]
    "not-sse": b"hello, I am not an event stream\nstill not\n",
    # JSON whose choices is not a list
    "bad-shape": b'data: {"choices": {"oops": 1}}\n\n',
    # a well-formed stream cut before [DONE]
    "no-done": _chunk("a") + _chunk("b"),
    # a good stream (from a server that refuses stream_options)
    "strict": _chunk("a") + _chunk("b", "length") + b"data: [DONE]\n\n",
}


class FakeServer:
    """``with FakeServer("bad-json") as f: f.url`` -> http://127.0.0.1:PORT/v1."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.port = 0
        self.requests = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FakeServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        self._server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            tasks = asyncio.all_tasks(loop)
            for t in tasks:  # a "hang" handler still sleeping
                t.cancel()
            if tasks:
                loop.run_until_complete(asyncio.wait(tasks))
            loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path = lines[0].split()[:2]
            length = next((int(ln.split(":", 1)[1]) for ln in lines if ln.lower().startswith("content-length:")), 0)
            body = await reader.readexactly(length) if length else b""
            self.requests += 1
            if method == "GET" and path.endswith("/models"):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(MODELS)).encode() + b"\r\nconnection: close\r\n\r\n" + MODELS)
            elif self.behaviour == "hang":
                await asyncio.sleep(3600)
            elif self.behaviour == "strict" and b"stream_options" in body:  # an old server
                err = json.dumps({"error": {"message": "Unrecognized request argument supplied: stream_options"}})
                writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(err)).encode() + b"\r\nconnection: close\r\n\r\n" + err.encode())
            elif self.behaviour == "http500":
                body = json.dumps({"error": {"message": "the engine fell over", "type": "server_error"}}).encode()
                writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
                             b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
            else:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
                             + BEHAVIOURS[self.behaviour])
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
