"""A test-only OpenAI-compatible server (uvicorn) that serves one request at a time and keeps what it got.

* **serial**: one ``asyncio.Lock`` around every answer, and each answer takes
  ``service_s`` (the server's behaviour: a server with one slot). Driven faster
  than it serves, requests back up: in the probe's client queue when the probe
  caps concurrency, in this lock otherwise.
* **recording**: every request body is kept in ``received`` (in arrival order),
  so a test can compare the prompts sent with the prompts in a dataset file.
* **answers like vLLM**: a role chunk, ``tokens`` content chunks (after an
  optional ``reasoning`` reasoning_content chunks and one empty-content chunk,
  which is not a token), ``finish_reason`` ``length``, and with
  ``include_usage`` a usage chunk carrying ``prompt_tokens_details.cached_tokens``
  and ``completion_tokens_details.reasoning_tokens``.

Nothing here is presented as real data: the server exists for the tests.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from tests.serving.openai_doubles import UvicornThread

__all__ = ["RecordingServer", "UvicornThread"]


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class RecordingServer:
    """``with UvicornThread(RecordingServer(service_s=0.1).app()) as s: ...``"""

    def __init__(self, service_s: float = 0.0, tokens: int = 3, reasoning: int = 0, cached: int | None = None,
                 prompt_tokens: int | None = 7, usage: bool = True) -> None:
        self.service_s = service_s
        self.tokens = tokens
        self.reasoning = reasoning
        self.cached = cached
        self.prompt_tokens = prompt_tokens
        self.usage = usage
        self.received: list[dict[str, Any]] = []
        self._lock: asyncio.Lock | None = None

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/models", self._models),
                                 Route("/v1/chat/completions", self._answer, methods=["POST"]),
                                 Route("/v1/completions", self._answer, methods=["POST"])])

    async def _models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "serial", "object": "model"}]})

    async def _answer(self, request: Request) -> StreamingResponse:
        body = await request.json()
        self.received.append(body)
        if self._lock is None:
            self._lock = asyncio.Lock()
        return StreamingResponse(self._stream(body, "messages" in body), media_type="text/event-stream")

    async def _stream(self, body: dict[str, Any], chat: bool) -> AsyncIterator[bytes]:
        assert self._lock is not None
        async with self._lock:  # one request at a time
            if self.service_s:
                await asyncio.sleep(self.service_s)
            if chat:
                yield self._chunk({"role": "assistant", "content": ""})
                for i in range(self.reasoning):
                    yield self._chunk({"reasoning_content": f" think{i}"})
                yield self._chunk({"content": ""})  # an empty chunk: not a token
                for i in range(self.tokens):
                    yield self._chunk({"content": f" w{i}"}, "length" if i == self.tokens - 1 else None)
            else:
                for i in range(self.tokens):
                    yield _event({"id": "cmpl-1", "object": "text_completion", "model": "serial",
                                  "choices": [{"index": 0, "text": f" w{i}",
                                               "finish_reason": "length" if i == self.tokens - 1 else None}]})
            if self.usage and (body.get("stream_options") or {}).get("include_usage"):
                usage: dict[str, Any] = {"completion_tokens": self.tokens + self.reasoning}
                if self.prompt_tokens is not None:
                    usage["prompt_tokens"] = self.prompt_tokens
                if self.cached is not None:
                    usage["prompt_tokens_details"] = {"cached_tokens": self.cached}
                if self.reasoning:
                    usage["completion_tokens_details"] = {"reasoning_tokens": self.reasoning}
                yield _event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "serial",
                              "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"

    @staticmethod
    def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "serial",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
