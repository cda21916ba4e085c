"""Test-only engine: an OpenAI-compatible server on a real ASGI server (uvicorn) that serves one
request at a time and exports its state on ``/metrics`` from a real ``prometheus_client``
registry, under vLLM's or SGLang's metric names.

Requests that arrive while another runs wait for the one slot: the waiting gauge counts them,
the queue-time histogram observes each wait when the request gets the slot, and
:attr:`EngineDouble.queue_truth` keeps every wait as the server measured it, the truth a test
compares the scraped numbers with. ``metrics`` picks a misbehaving ``/metrics`` instead
(``html``, ``404``, ``huge``, ``hang``, ``malformed``). Nothing here is presented as real data.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.serving.openai_doubles import UvicornThread

MODEL = "engine-double"
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
#: the names each flavour exports, concept -> metric name (as given to prometheus_client)
NAMES = {
    "vllm": {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
             "kv": "vllm:kv_cache_usage_perc", "queue": "vllm:request_queue_time_seconds",
             "prefill": "vllm:request_prefill_time_seconds", "decode": "vllm:request_decode_time_seconds",
             "ttft": "vllm:time_to_first_token_seconds", "itl": "vllm:inter_token_latency_seconds",
             "preemptions": "vllm:num_preemptions", "prefix_queries": "vllm:prefix_cache_queries",
             "prefix_hits": "vllm:prefix_cache_hits"},
    "sglang": {"running": "sglang:num_running_reqs", "waiting": "sglang:num_queue_reqs",
               "kv": "sglang:token_usage", "queue": "sglang:queue_time_seconds",
               "ttft": "sglang:time_to_first_token_seconds", "itl": "sglang:inter_token_latency_seconds",
               "hit_rate": "sglang:cache_hit_rate"},
}


class EngineDouble:
    """``with EngineDouble("vllm") as e: e.url`` -> http://127.0.0.1:PORT/v1 (one slot, real metrics)."""

    def __init__(self, flavour: str = "vllm", *, tokens: int = 4, prefill_s: float = 0.03, token_s: float = 0.015,
                 metrics: str = "ok", openmetrics: bool = False) -> None:
        self.flavour, self.tokens, self.prefill_s, self.token_s = flavour, tokens, prefill_s, token_s
        self.metrics_mode, self.openmetrics = metrics, openmetrics
        self.registry = CollectorRegistry()
        self.queue_truth: list[float] = []
        self.scrapes = 0
        self.closing = False
        names, labels = NAMES[flavour], ["model_name"]
        self.m: dict[str, Any] = {}
        for key in ("running", "waiting", "kv", "hit_rate"):
            if key in names:
                self.m[key] = Gauge(names[key], key, labels, registry=self.registry).labels(MODEL)
        for key in ("queue", "prefill", "decode", "ttft", "itl"):
            if key in names:
                self.m[key] = Histogram(names[key], key, labels, buckets=BUCKETS, registry=self.registry).labels(MODEL)
        for key in ("preemptions", "prefix_queries", "prefix_hits"):
            if key in names:
                self.m[key] = Counter(names[key], key, labels, registry=self.registry).labels(MODEL)
        self._slot: asyncio.Lock | None = None
        self._server = UvicornThread(self.app())

    @property
    def url(self) -> str:
        return self._server.url

    def __enter__(self) -> EngineDouble:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing = True
        self._server.__exit__(*exc)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/models", self._models), Route("/metrics", self._metrics),
                                 Route("/v1/chat/completions", self._chat, methods=["POST"])])

    # -- the OpenAI side ---------------------------------------------------------------------
    async def _models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _chat(self, request: Request) -> StreamingResponse:
        body = await request.json()
        return StreamingResponse(self._generate(body), media_type="text/event-stream")

    async def _generate(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        if self._slot is None:
            self._slot = asyncio.Lock()
        m = self.m
        arrived = time.perf_counter()
        m["waiting"].inc()
        async with self._slot:
            m["waiting"].dec()
            m["running"].inc()
            waited = time.perf_counter() - arrived
            self.queue_truth.append(waited)
            m["queue"].observe(waited)
            m["kv"].set(0.5)
            if "prefix_queries" in m:
                m["prefix_queries"].inc(64)
                m["prefix_hits"].inc(16)
            if "hit_rate" in m:
                m["hit_rate"].set(0.25)
            t0 = time.perf_counter()
            await asyncio.sleep(self.prefill_s)
            if "prefill" in m:
                m["prefill"].observe(time.perf_counter() - t0)
            m["ttft"].observe(time.perf_counter() - arrived)
            t1 = last = time.perf_counter()
            for i in range(self.tokens):
                if i:
                    await asyncio.sleep(self.token_s)
                    now = time.perf_counter()
                    m["itl"].observe(now - last)
                    last = now
                yield _chunk({"content": f" w{i}"}, "length" if i == self.tokens - 1 else None)
            if "decode" in m:
                m["decode"].observe(time.perf_counter() - t1)
            m["running"].dec()
            m["kv"].set(0.0)
        usage = {"completion_tokens": self.tokens, "prompt_tokens": 8, "total_tokens": self.tokens + 8}
        yield b"data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "model": MODEL, "choices": [],
                                      "usage": usage}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    # -- /metrics ------------------------------------------------------------------------------
    async def _metrics(self, request: Request) -> Response:
        self.scrapes += 1
        mode = self.metrics_mode
        if mode == "html":
            return Response("<!doctype html><html><body><h1>Dashboard</h1></body></html>", media_type="text/html")
        if mode == "404":
            return Response("404 page not found", status_code=404, media_type="text/plain")
        if mode == "huge":
            return StreamingResponse(_huge(50 << 20), media_type="text/plain; version=0.0.4")
        if mode == "hang":
            while not self.closing:  # answers nothing until the server shuts down
                await asyncio.sleep(0.05)
            return Response("", status_code=503)
        if self.openmetrics:
            return Response(generate_openmetrics(self.registry), media_type=OPENMETRICS_TYPE)
        text = generate_latest(self.registry)
        if mode == "malformed":  # one broken line in the middle of good ones
            lines = text.split(b"\n")
            lines.insert(len(lines) // 2, b'vllm:broken{model_name="x" 1 2 3')
            text = b"\n".join(lines)
        return Response(text, media_type=CONTENT_TYPE_LATEST)


def _chunk(delta: dict[str, Any], finish: str | None) -> bytes:
    return (b"data: "
            + json.dumps({"id": "c", "object": "chat.completion.chunk", "model": MODEL,
                          "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode()
            + b"\n\n")


async def _huge(n: int) -> AsyncIterator[bytes]:
    line = b'vllm:filler_total{model_name="m",shard="0000000000"} 1.0\n' * 1024
    sent = 0
    while sent < n:
        yield line
        sent += len(line)
