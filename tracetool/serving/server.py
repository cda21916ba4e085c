"""``tracetool serve``: an OpenAI-compatible server with the collectors on.

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(streamed as Server-Sent Events or not), ``GET /health``. The app is plain
Starlette wrapped in :class:`collectors.asgi.TracetoolMiddleware`, the same
middleware a user puts in their own FastAPI server, so what this server
records is what the middleware + collectors record anywhere:

* ``server.request`` (middleware), ``preprocess`` (chat template),
  ``tokenize`` (here, on the event loop), ``queue``/``prefill``/``decode``/
  ``detokenize`` and the ``tokens``/``steps`` rows (the engine);
* a ``requests`` row per request with sizes and outcome.

Limits (request body size, prompt and output length, queued requests) are
flags of ``tracetool serve``; what breaks them gets an OpenAI-style JSON error.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from collectors.asgi import TracetoolMiddleware, request_handle
from tracetool.recorder import Recorder, RequestHandle
from tracetool.serving.engine import Engine, GenRequest, Overloaded
from tracetool.serving.openai_api import (
    ApiError,
    Limits,
    Parsed,
    check_lengths,
    chunk,
    completion,
    models_list,
    parse_request,
    usage_chunk,
)


@dataclass
class ServerState:
    """What the handlers share: the engine, the recorder, the model's name and limits."""

    engine: Engine
    recorder: Recorder
    served: str
    context: int
    limits: Limits

    def encode(self, p: Parsed, handle: RequestHandle) -> list[int]:
        """Prompt token ids (chat template as ``preprocess``, tokenization as ``tokenize``)."""
        tok = self.engine.tokenizer
        if not p.chat:
            if isinstance(p.prompt, list):
                vocab = len(tok)
                if any(t >= vocab for t in p.prompt):
                    raise ApiError(400, f"token ids must be below the vocabulary size {vocab}", param="prompt")
                return list(p.prompt)
            with handle.span("tokenize"):
                return list(tok(p.prompt)["input_ids"])
        with handle.span("preprocess"):
            text = render_chat(tok, p.messages)
        with handle.span("tokenize"):
            return list(tok(text, add_special_tokens=False)["input_ids"])


def render_chat(tok: Any, messages: list[dict[str, str]]) -> str:
    """The model's chat template, or a plain ``role: content`` layout when it has none."""
    if getattr(tok, "chat_template", None):
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if isinstance(text, str):
            return text
    bos = getattr(tok, "bos_token", None) or ""
    return bos + "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def _read_json(request: Request, limit: int) -> Any:
    size = request.headers.get("content-length")
    too_big = ApiError(413, f"request body over this server's limit of {limit} bytes "
                       "(tracetool serve --max-body-bytes)", code="request_too_large")
    if size is not None and size.isdigit() and int(size) > limit:
        raise too_big
    parts, n = [], 0
    async for part in request.stream():
        n += len(part)
        if n > limit:
            raise too_big
        parts.append(part)
    raw = b"".join(parts)
    if not raw.strip():
        raise ApiError(400, "empty request body: send a JSON object")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the body is not valid JSON ({e})") from e


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


async def models(request: Request) -> Response:
    st: ServerState = request.app.state.tracetool
    return JSONResponse(models_list(st.served, st.context))


async def health(request: Request) -> Response:
    st: ServerState = request.app.state.tracetool
    active, waiting = st.engine.load
    return JSONResponse({"status": "ok", "active": active, "waiting": waiting})


async def chat_completions(request: Request) -> Response:
    return await _generate(request, chat=True)


async def completions(request: Request) -> Response:
    return await _generate(request, chat=False)


async def _generate(request: Request, chat: bool) -> Response:
    st: ServerState = request.app.state.tracetool
    handle = request_handle(request) or st.recorder.request()
    try:
        body = await _read_json(request, st.limits.max_body_bytes)
        p = parse_request(body, chat=chat, served=st.served, limits=st.limits)
        ids = st.encode(p, handle)
        check_lengths(len(ids), p.max_tokens, context=st.context, limits=st.limits)
    except ApiError as e:
        return _error(e)
    handle.prompt_tokens = len(ids)
    handle.prompt_chars = len(p.prompt) if isinstance(p.prompt, str) and not chat else \
        sum(len(m["content"]) for m in p.messages) if chat else None
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

    def emit(ev: tuple[Any, ...]) -> None:
        loop.call_soon_threadsafe(events.put_nowait, ev)

    job = GenRequest(handle, ids, p.max_tokens, emit, temperature=p.temperature, top_p=p.top_p, seed=p.seed,
                     stop=p.stop, ignore_eos=p.ignore_eos, min_tokens=p.min_tokens)
    try:
        st.engine.submit(job)
    except Overloaded as e:
        return _error(ApiError(503, f"server overloaded: {e}; retry later", type_="server_error",
                               code="overloaded"))
    created = int(time.time())
    rid = handle.request_id
    if p.stream:
        return StreamingResponse(_stream(st, job, events, rid, p, created), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    text: list[str] = []
    try:
        while True:
            ev = await events.get()
            if ev[0] == "token":
                text.append(ev[2])
            elif ev[0] == "done":
                return JSONResponse(completion(rid, p, created, "".join(text), ev[1], ev[2]))
            else:
                handle.status, handle.error = "error", str(ev[1])
                return _error(ApiError(500, str(ev[1]), type_="server_error"))
    finally:
        st.engine.cancel(job)  # no-op once finished; stops the work if this handler was cancelled


async def _stream(st: ServerState, job: GenRequest, events: asyncio.Queue[tuple[Any, ...]], rid: str,
                  p: Parsed, created: int) -> AsyncIterator[str]:
    first = True
    finished = False
    try:
        while not finished:
            batch = [await events.get()]
            while not events.empty():  # what piled up goes out in one write
                batch.append(events.get_nowait())
            out = []
            for ev in batch:
                if ev[0] == "token":
                    if ev[2]:
                        out.append(_sse(chunk(rid, p, created, ev[2], first=first)))
                        first = False
                elif ev[0] == "done":
                    out.append(_sse(chunk(rid, p, created, None, first=first, finish=ev[1])))
                    if p.include_usage:
                        out.append(_sse(usage_chunk(rid, p, created, ev[2])))
                    out.append("data: [DONE]\n\n")
                    finished = True
                    break
                else:
                    job.handle.status, job.handle.error = "error", str(ev[1])
                    out.append(_sse({"error": {"message": str(ev[1]), "type": "server_error",
                                               "param": None, "code": None}}))
                    out.append("data: [DONE]\n\n")
                    finished = True
                    break
            if out:
                yield "".join(out)
    finally:
        if not finished:
            st.engine.cancel(job)  # the client went away


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    msg = f"{request.method} {request.url.path}: {exc.detail}"
    return _error(ApiError(exc.status_code, msg, code=code))


async def _server_error(request: Request, exc: Exception) -> Response:
    return _error(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type_="server_error"))


def build_app(state: ServerState) -> Any:
    """The ASGI app: Starlette routes wrapped in the tracetool middleware."""
    app = Starlette(routes=[
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ], exception_handlers={HTTPException: _http_error, Exception: _server_error})
    app.state.tracetool = state
    # the runner closes the recorder itself, after the engine has ended its requests
    return TracetoolMiddleware(app, recorder=state.recorder, close_recorder=False)
