"""A user's own OpenAI-style server with the middleware and nothing else: the docs/serving.md recipe.

    python middleware_server.py TRACE_DIR [--lifespan on|off]

With ``--lifespan off`` it also installs the SIGTERM handler docs/serving.md gives
for servers run without a lifespan.
The shape of llama-cpp-python's FastAPI app wrapped with ``TracetoolMiddleware``:
the token loop is not instrumented, so the server trace holds ``server.request``
spans and ``requests`` rows but no tokens. The "model" is a test double (a fixed
sentence streamed word by word, 3 ms apart) on a real uvicorn. Started the way
the recipe says (``uvicorn.run`` inside ``try``/``finally: rec.close()``), so a
test can stop it with SIGTERM or SIGINT the way a process manager does and read
whether the trace ended closed.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from collectors import Recorder
from collectors.asgi import TracetoolMiddleware

WORDS = ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "and", "runs", "far", "away"]


async def models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
    body = {"id": "c", "object": "chat.completion.chunk", "created": int(time.time()), "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
    return f"data: {json.dumps(body)}\n\n"


async def chat(request: Request) -> StreamingResponse:
    body = await request.json()
    n = min(int(body.get("max_tokens") or 8), len(WORDS))

    async def gen() -> Any:
        yield _chunk({"role": "assistant", "content": ""})
        for w in WORDS[:n]:
            await asyncio.sleep(0.003)
            yield _chunk({"content": " " + w})
        yield _chunk({}, "length", usage={"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n})
        yield "data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


def main() -> None:
    trace = sys.argv[1]
    lifespan = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--lifespan" else "auto"
    app = Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])])
    rec = Recorder(trace).start()
    app.add_middleware(TracetoolMiddleware, recorder=rec)
    if lifespan == "off":  # no lifespan shutdown to close on: the recipe's SIGTERM line
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        # uvicorn prints "Uvicorn running on http://127.0.0.1:PORT" on stderr once it accepts
        uvicorn.run(app, host="127.0.0.1", port=0, lifespan=lifespan, log_level="info", access_log=False)
    finally:
        rec.close()


if __name__ == "__main__":
    main()
