"""The ASGI middleware in a plain Starlette app (as in a user's server), driven over real HTTP."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from collectors import Recorder, current_request, now_ns
from collectors.asgi import TracetoolMiddleware, request_handle, request_id_from_headers
from tests.serving.conftest import span_durations
from tests.serving.openai_doubles import UvicornThread
from tracetool.reader import open_trace
from tracetool.serving.sse import parse_server_timing

MS = 1_000_000


async def plain(request: Request) -> JSONResponse:
    h = request_handle(request)
    assert h is not None and current_request() is h
    t = now_ns()
    h.add_span("queue", t, t + 3 * MS)
    h.add_span("prefill", t + 3 * MS, t + 5 * MS)
    with h.span("tokenize"):
        pass
    return JSONResponse({"request_id": h.request_id})


def _event(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def sse(request: Request) -> StreamingResponse:
    together = request.query_params.get("together") == "1"
    h = request_handle(request)

    async def gen() -> Any:
        assert h is not None
        t = now_ns()
        h.add_span("decode", t, t + 7 * MS)
        yield _event({"id": "c1", "object": "chat.completion.chunk", "model": "m",
                      "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]})
        last = _event({"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
        if together:
            yield last + "data: [DONE]\n\n"
        else:
            yield last
            yield "data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


async def threaded(request: Request) -> PlainTextResponse:
    h = request_handle(request)
    assert h is not None

    def engine_thread() -> None:  # the way an engine worker records for a request
        t = now_ns()
        h.add_span("decode", t, t + MS)
        h.token(0, 10, t + MS)

    th = threading.Thread(target=engine_thread)
    th.start()
    th.join()
    # run_in_threadpool copies the context: the current request is there too
    same = await run_in_threadpool(lambda: current_request() is h)
    return PlainTextResponse(str(same))


async def boom(request: Request) -> PlainTextResponse:
    raise RuntimeError("handler broke")


async def health(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


def make_app(rec: Recorder) -> Any:
    app = Starlette(routes=[Route("/plain", plain), Route("/sse", sse), Route("/threaded", threaded),
                            Route("/boom", boom), Route("/health", health)])
    app.add_middleware(TracetoolMiddleware, recorder=rec)  # how a FastAPI user installs it
    return app


class Served:
    """The test app on a real uvicorn (loopback, free port) in a thread."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.server = UvicornThread(make_app(rec)).__enter__()
        self.url = self.server.base_url

    def stop(self) -> Recorder:
        """Shut the server down, then close the recorder. The client has its response before the
        middleware records ``server.request`` and the request's row (they come after the last
        byte is sent); uvicorn's graceful shutdown waits for those request tasks to end."""
        self.server.__exit__()
        assert not self.server.running, "uvicorn did not shut down"
        self.rec.close()
        return self.rec


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = Served(Recorder(tmp_path / "trace").start())
    yield s
    s.stop()


def test_plain_response_gets_request_id_and_server_timing(served: Served) -> None:
    url = served.url
    r = httpx.get(f"{url}/plain", headers={"X-Request-ID": "req-42"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "req-42"
    assert r.json()["request_id"] == "req-42"
    timing = parse_server_timing(r.headers["server-timing"])
    assert timing["queue"] == pytest.approx(3.0) and timing["prefill"] == pytest.approx(2.0)
    assert "tokenize" in timing and timing["server"] >= 0
    rec = served.stop()
    d = span_durations(open_trace(rec.path))["req-42"]
    assert set(d) == {"server.request", "queue", "prefill", "tokenize"}
    assert d["server.request"] >= timing["server"] * MS - 1000  # the span ends after the header was built
    assert open_trace(rec.path).table("requests").to_pylist()[0]["status"] == "ok"


def test_request_ids_adopted_or_made() -> None:
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert request_id_from_headers([(b"traceparent", tp.encode())]) == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert request_id_from_headers([(b"X-Request-Id", b"abc"), (b"traceparent", tp.encode())]) == "abc"
    assert request_id_from_headers([(b"x-request-id", b"bad id with spaces")]) is None
    assert request_id_from_headers([(b"traceparent", b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01")]) is None
    assert request_id_from_headers([]) is None


def test_made_up_id_is_echoed(served: Served) -> None:
    url = served.url
    a, b = httpx.get(f"{url}/plain"), httpx.get(f"{url}/plain", headers={"X-Request-ID": "no spaces allowed"})
    assert len(a.headers["x-request-id"]) == 32 and a.headers["x-request-id"] != b.headers["x-request-id"]


@pytest.mark.parametrize("together", [True, False])
def test_sse_final_event_carries_server_timing(served: Served, together: bool) -> None:
    url = served.url
    with httpx.stream("GET", f"{url}/sse", params={"together": "1" if together else "0"}) as r:
        assert "server-timing" not in r.headers  # streamed: the numbers come at the end
        events = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    final = json.loads(events[-2])
    assert final["server_timing"]["decode"] == pytest.approx(7.0) and final["server_timing"]["server"] > 0
    if together:  # merged into the app's own last event
        assert len(events) == 3 and final["usage"]["total_tokens"] == 2
    else:  # a separate event shaped like the stream's chunks
        assert len(events) == 4 and final["choices"] == [] and final["id"] == "c1"
        assert "server_timing" not in json.loads(events[-3])


def test_worker_threads_record_on_the_request(served: Served) -> None:
    url = served.url
    r = httpx.get(f"{url}/threaded", headers={"X-Request-ID": "t1"})
    assert r.text == "True"
    assert parse_server_timing(r.headers["server-timing"])["decode"] == pytest.approx(1.0)
    rec = served.stop()
    t = open_trace(rec.path)
    assert t.table("tokens").column("request_id").to_pylist() == ["t1"]


def test_app_errors_pass_through_and_are_recorded(served: Served) -> None:
    url = served.url
    r = httpx.get(f"{url}/boom", headers={"X-Request-ID": "b1"})
    assert r.status_code == 500  # Starlette's own error page: the exception reached it untouched
    r = httpx.get(f"{url}/nowhere", headers={"X-Request-ID": "n1"})
    assert r.status_code == 404
    rec = served.stop()
    rows = {row["request_id"]: row for row in open_trace(rec.path).table("requests").to_pylist()}
    assert rows["b1"]["status"] == "error" and "handler broke" in rows["b1"]["error"]
    assert rows["n1"]["status"] == "error" and rows["n1"]["error"] == "HTTP 404"


def test_health_checks_are_not_recorded(served: Served) -> None:
    url = served.url
    assert httpx.get(f"{url}/health").status_code == 200
    rec = served.stop()
    assert open_trace(rec.path).rows("spans") == 0


def test_many_requests_keep_their_ids(tmp_path: Path) -> None:
    """Request rows land in tables flushed at different times: every id survives (writer regression).
    The flushes fall between requests at points the test chooses, not where a clock puts them."""
    rec = Recorder(tmp_path / "t").start()
    app = make_app(rec)
    transport = httpx.ASGITransport(app=app)

    async def go() -> None:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            for i in range(60):
                await c.get("/plain", headers={"X-Request-ID": f"r{i}"})
                if i % 7 in (2, 3):
                    rec.writer.flush()

    asyncio.run(go())
    rec.close()
    t = open_trace(rec.path)
    assert sorted(t.table("requests").column("request_id").to_pylist()) == sorted(f"r{i}" for i in range(60))
    assert t.table("spans").column("request_id").null_count == 0
