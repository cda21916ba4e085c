"""A test double: an OpenAI-compatible server that publishes spans shaped exactly like vLLM's.

It knows nothing of tracetool (it imports none of it): it keeps its own
request ids (``chatcmpl-<uuid>``, ignoring ``X-Request-ID``), runs one request
at a time on a simulated engine (so concurrent requests really queue), and
spends ``FRONTEND_S`` before the engine's arrival (as vLLM's API server does its
HTTP handling, chat template and tokenization outside the span), and
exports one ``llm_request`` SERVER span per request through the real
OpenTelemetry SDK and OTLP exporter, the way vLLM does
(``vllm/tracing.py`` ``init_tracer`` / ``get_span_exporter``: the protocol
from ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, ``grpc`` by default; the span
built in ``OutputProcessor.do_tracing``: parented on the request's
``traceparent``, started at the arrival time, the ``gen_ai.latency.*``
durations in seconds).

Run: ``python vllm_shaped_server.py --otlp-traces-endpoint URL --truth FILE``.
It prints ``ready PORT`` on stdout once it accepts connections, writes one JSON
line per request to FILE with the durations it reported (the ground truth a
test compares the received trace with), and flushes its spans on SIGTERM.
Only ever used by the tests; the product never presents it as a real server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import uvicorn
from opentelemetry.sdk.environment_variables import OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, format_trace_id, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

MODEL = "vllm-shaped"
PREFILL_S_PER_WORD = 0.0004
PREFILL_BASE_S = 0.015
DECODE_STEP_S = 0.006
#: the API server's own work before the engine's arrival (HTTP, chat template, tokenization)
FRONTEND_S = 0.05


def span_exporter(endpoint: str) -> Any:
    protocol = os.environ.get(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, "grpc")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    elif protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
    else:
        raise ValueError(f"Unsupported OTLP protocol '{protocol}' is configured")
    return OTLPSpanExporter(endpoint=endpoint)


class Engine:
    """One request at a time; the others wait (vLLM's queued -> scheduled)."""

    def __init__(self) -> None:
        self.slot = asyncio.Lock()


def build(endpoint: str, truth_path: str) -> tuple[Starlette, TracerProvider]:
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm-shaped"}))
    provider.add_span_processor(BatchSpanProcessor(span_exporter(endpoint), schedule_delay_millis=200))
    tracer = provider.get_tracer("vllm.llm_engine")
    engine = Engine()
    truth = open(truth_path, "a", buffering=1)  # noqa: SIM115  (open for the server's life)

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def chat(request: Request) -> Any:
        # vLLM's API server parses the request, renders the chat template and tokenizes before the
        # engine's arrival time, where llm_request starts: its frontend is outside the span
        await asyncio.sleep(FRONTEND_S)
        arrival = time.time()
        body = await request.json()
        request_id = f"chatcmpl-{uuid.uuid4().hex}"  # its own id, whatever the client sent
        ctx = TraceContextTextMapPropagator().extract(dict(request.headers))
        prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        prompt_len = len(prompt.split())
        max_tokens = int(body.get("max_tokens") or 16)
        usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def generate() -> Any:
            created = int(arrival)
            stats: dict[str, float] = {"queued_ts": time.monotonic()}
            yield _sse({"id": request_id, "object": "chat.completion.chunk", "created": created, "model": MODEL,
                        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "finish_reason": None}]})
            async with engine.slot:
                stats["scheduled_ts"] = time.monotonic()
                await asyncio.sleep(PREFILL_BASE_S + PREFILL_S_PER_WORD * prompt_len)
                for i in range(max_tokens):
                    if i:
                        await asyncio.sleep(DECODE_STEP_S)
                    now = time.monotonic()
                    if i == 0:
                        stats["first_token_ts"] = now
                        stats["first_token_latency"] = time.time() - arrival
                    stats["last_token_ts"] = now
                    last = i == max_tokens - 1
                    yield _sse({"id": request_id, "object": "chat.completion.chunk", "created": created,
                                "model": MODEL, "choices": [{"index": 0, "delta": {"content": f" w{i}"},
                                                             "finish_reason": "length" if last else None}]})
            if usage:
                yield _sse({"id": request_id, "object": "chat.completion.chunk", "created": created,
                            "model": MODEL, "choices": [],
                            "usage": {"prompt_tokens": prompt_len, "completion_tokens": max_tokens,
                                      "total_tokens": prompt_len + max_tokens}})
            yield b"data: [DONE]\n\n"
            # vLLM's do_tracing, when the request finishes
            e2e = time.time() - arrival
            queued = stats["scheduled_ts"] - stats["queued_ts"]
            prefill = stats["first_token_ts"] - stats["scheduled_ts"]
            decode = stats["last_token_ts"] - stats["first_token_ts"]
            inference = stats["last_token_ts"] - stats["scheduled_ts"]
            with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER, context=ctx,
                                              start_time=int(arrival * 1e9)) as span:
                span.set_attribute("gen_ai.latency.time_to_first_token", stats["first_token_latency"])
                span.set_attribute("gen_ai.latency.e2e", e2e)
                span.set_attribute("gen_ai.latency.time_in_queue", queued)
                span.set_attribute("gen_ai.usage.prompt_tokens", prompt_len)
                span.set_attribute("gen_ai.usage.completion_tokens", max_tokens)
                span.set_attribute("gen_ai.latency.time_in_model_prefill", prefill)
                span.set_attribute("gen_ai.latency.time_in_model_decode", decode)
                span.set_attribute("gen_ai.latency.time_in_model_inference", inference)
                span.set_attribute("gen_ai.request.id", request_id)
                span.set_attribute("gen_ai.request.max_tokens", max_tokens)
                span.set_attribute("gen_ai.request.n", 1)
                trace_id = format_trace_id(get_current_span().get_span_context().trace_id)
            truth.write(json.dumps({"request_id": request_id, "trace_id": trace_id, "e2e": e2e,
                                    "ttft": stats["first_token_latency"], "queue": queued, "prefill": prefill,
                                    "decode": decode, "frontend": FRONTEND_S}) + "\n")

        return StreamingResponse(generate(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])])
    return app, provider


def _sse(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--otlp-traces-endpoint", required=True)
    ap.add_argument("--truth", required=True)
    args = ap.parse_args()
    app, provider = build(args.otlp_traces_endpoint, args.truth)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn re-raises SIGTERM after shutting down, which would end the process before the
            # spans are flushed; stop on it instead, as vLLM's own shutdown does
            def stop(sig: int, frame: Any) -> None:
                self.should_exit = True

            old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in old.items():
                    signal.signal(s, h)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            print(f"ready {sock.getsockname()[1]}", flush=True)

    server = Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    try:
        server.run(sockets=[sock])
    finally:
        provider.shutdown()  # flushes the batch processor: every span is exported before exit
        sys.stdout.flush()


if __name__ == "__main__":
    main()
