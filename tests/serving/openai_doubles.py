"""Test-only OpenAI-compatible servers on a real ASGI server (uvicorn), streaming what real servers send.

Each behaviour reproduces, chunk for chunk, one way a real server answers; the
model name in the request picks it (``--model NAME`` of the probe), so one
server covers a test's cases:

* ``llama-server``: llama.cpp's ``llama-server`` (tools/server/server-task.cpp):
  a role chunk, content chunks, a chunk with ``finish_reason`` and an empty
  delta, then (``include_usage``) a usage chunk with empty ``choices`` that
  carries ``timings``; the server waits ``PROMPT_MS`` before the first token
  and ``PREDICTED_MS`` over the rest, as those timings say.
* ``vllm-metrics``: vLLM ``--enable-per-request-metrics``: the final usage chunk
  carries ``metrics`` when the request asked ``include_metrics``.
* ``interrupted``: llama-cpp-python's server interrupting a running stream for
  a new request: a role-only chunk, then ``[DONE]``.
* ``no-finish``: content, then ``[DONE]``, never a ``finish_reason``.
* ``error-event``: a token, then an ``error`` event and ``[DONE]`` (vLLM, SGLang).
* ``cut``: a token, then the connection closes mid-body.
* ``abort``: tokens ending with ``finish_reason: abort``.
* ``short``: 2 tokens of the 8 asked, ``finish_reason: length`` (a normal answer).

Nothing here is presented as real data: these servers exist for the tests.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from tests.waiting import wait_until

PROMPT_MS = 60.0
PREDICTED_MS = 90.0
TOKENS = 4
VLLM = {"queue_time_ms": 20.0, "time_to_first_token_ms": 40.0, "generation_time_ms": 75.0}
BEHAVIOURS = ("llama-server", "vllm-metrics", "interrupted", "no-finish", "error-event", "cut", "abort", "short")


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(model: str, delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return _event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model,
                   "choices": choices, **extra})


class _Cut(Exception):
    """Raised inside a body to make uvicorn drop the connection mid-response."""


async def _stream(model: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
    usage = bool((body.get("stream_options") or {}).get("include_usage"))
    n_prompt = len(str(body.get("messages", "")).split())
    if model == "interrupted":
        yield _chunk(model, {"role": "assistant", "content": ""})
    elif model == "llama-server":
        yield _chunk(model, {"role": "assistant", "content": None})
        await asyncio.sleep(PROMPT_MS / 1000)
        t0 = time.perf_counter()
        for i in range(TOKENS):
            if i:
                await asyncio.sleep(PREDICTED_MS / 1000 / (TOKENS - 1))
            yield _chunk(model, {"content": f" w{i}"})
        predicted = (time.perf_counter() - t0) * 1000
        timings = {"cache_n": 0, "prompt_n": n_prompt, "prompt_ms": PROMPT_MS,
                   "prompt_per_token_ms": PROMPT_MS / max(n_prompt, 1), "prompt_per_second": 1.0,
                   "predicted_n": TOKENS, "predicted_ms": predicted,
                   "predicted_per_token_ms": predicted / TOKENS, "predicted_per_second": 1.0}
        usage_obj = {"completion_tokens": TOKENS, "prompt_tokens": n_prompt, "total_tokens": TOKENS + n_prompt}
        if usage:  # llama.cpp puts timings on the last of the final deltas
            yield _chunk(model, {}, "length")
            yield _chunk(model, None, usage=usage_obj, timings=timings)
        else:
            yield _chunk(model, {}, "length", timings=timings)
    elif model == "vllm-metrics":
        for i in range(TOKENS):
            yield _chunk(model, {"content": f" w{i}"}, "length" if i == TOKENS - 1 else None)
        if usage:
            extra = {"metrics": VLLM} if body.get("include_metrics") else {}
            yield _chunk(model, None, usage={"completion_tokens": TOKENS, "prompt_tokens": n_prompt,
                                             "total_tokens": TOKENS + n_prompt}, **extra)
    elif model == "no-finish":
        yield _chunk(model, {"content": "a"})
        yield _chunk(model, {"content": "b"})
    elif model == "error-event":
        yield _chunk(model, {"content": "a"})
        yield _event({"error": {"message": "out of KV cache blocks", "type": "server_error", "code": 500}})
    elif model == "cut":
        yield _chunk(model, {"content": "a"})
        raise _Cut("the server went away")
    elif model == "abort":
        yield _chunk(model, {"content": "a"})
        yield _chunk(model, {"content": "b"}, "abort")
    elif model == "short":
        yield _chunk(model, {"content": "a"})
        yield _chunk(model, {"content": "b"}, "length")
    yield b"data: [DONE]\n\n"


async def _models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [{"id": b, "object": "model"} for b in BEHAVIOURS]})


async def _chat(request: Request) -> StreamingResponse | JSONResponse:
    body = await request.json()
    model = str(body.get("model"))
    if model not in BEHAVIOURS:
        return JSONResponse({"error": {"message": f"no model {model}"}}, status_code=404)
    return StreamingResponse(_stream(model, body), media_type="text/event-stream")


def app() -> Starlette:
    return Starlette(routes=[Route("/v1/models", _models), Route("/v1/chat/completions", _chat, methods=["POST"])])


class UvicornThread:
    """``with UvicornThread(app()) as s: s.url`` -> http://127.0.0.1:PORT/v1 (a free port)."""

    def __init__(self, asgi: Any) -> None:
        config = uvicorn.Config(asgi, host="127.0.0.1", port=0, log_level="critical", lifespan="off")
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, daemon=True, name="uvicorn-double")

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT, without the API's ``/v1``."""
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def running(self) -> bool:
        """Whether the server's thread is still alive (after ``__exit__``: it did not shut down)."""
        return self._thread.is_alive()

    def __enter__(self) -> UvicornThread:
        self._thread.start()
        # uvicorn sets started once the socket listens
        wait_until(lambda: self.server.started or not self._thread.is_alive(), "the test server listening",
                   timeout=10, interval=0.01)
        if not self.server.started:
            raise RuntimeError("the test server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(10)
