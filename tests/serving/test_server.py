"""`tracetool serve` as a real server: the official openai client, OpenAI-style errors, concurrency."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from tests.serving.conftest import MODEL, Server, span_durations
from tests.waiting import wait_until
from tracetool.reader import Trace, open_trace
from tracetool.serving.probe import ProbeConfig, run_probe

pytestmark = pytest.mark.slow

MSG = [{"role": "user", "content": "tell me about the river"}]


def poll_trace(path: Path, ok: Callable[[Trace], bool], timeout_s: float = 30.0) -> Trace:
    """The server writes its trace while it runs (flushed every 0.5 s): wait until ``ok`` holds."""
    traces: list[Trace] = []

    def read() -> bool:
        traces[:] = [open_trace(path)]
        return ok(traces[0])

    try:
        wait_until(read, f"the server's trace at {path}", timeout=timeout_s, interval=0.1)
    except AssertionError:
        pass  # the caller's assertions on the trace say what it lacks
    return traces[0]


def test_official_openai_client_lists_models_and_streams(server: Server) -> None:
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL]
    stream = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=6, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_headers={"X-Request-ID": "openai-1"},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    last = chunks[-1]
    assert last.usage is not None and last.usage.completion_tokens == 6
    # the server's own timing rides along as an extra field the client keeps and ignores
    timing = (last.model_extra or {}).get("server_timing")
    assert timing is not None and timing["server"] >= timing["prefill"] + timing["decode"] > 0
    resp = client.completions.create(model=MODEL, prompt="the garden", max_tokens=3)
    assert resp.usage.completion_tokens <= 3 and resp.choices[0].finish_reason in ("length", "stop")
    # wait for all six: a flush can land between two of a request's tokens
    t = poll_trace(server.trace, lambda t: t.table("tokens").column("request_id").to_pylist().count("openai-1") >= 6)
    assert t.table("tokens").column("request_id").to_pylist().count("openai-1") == 6


def test_official_client_raises_typed_errors(server: Server) -> None:
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="gpt-nothing", messages=MSG)
    assert "does not exist" in nf.value.message and nf.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as br:
        client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=100_000)
    assert br.value.param == "max_tokens"


@pytest.mark.parametrize(("path", "body", "status", "needle"), [
    ("/chat/completions", b"{not json", 400, "not valid JSON"),
    ("/chat/completions", b"", 400, "empty request body"),
    ("/chat/completions", b"[]", 400, "JSON object"),
    ("/chat/completions", json.dumps({"model": MODEL}).encode(), 400, "'messages' is required"),
    ("/chat/completions", json.dumps({"model": MODEL, "messages": MSG, "temperature": "hot"}).encode(), 400,
     "'temperature' must be a number"),
    ("/completions", json.dumps({"model": MODEL, "prompt": 5}).encode(), 400, "'prompt' must be"),
    ("/completions", json.dumps({"model": MODEL, "prompt": "x " * 6000}).encode(), 400, "above this server's limit"),
    ("/completions", json.dumps({"model": MODEL, "prompt": "x" * (2 << 20)}).encode(), 413, "request body over"),
    ("/nowhere", b"{}", 404, "Not Found"),
])
def test_malformed_requests_get_openai_errors(server: Server, path: str, body: bytes, status: int,
                                              needle: str) -> None:
    r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status
    err = r.json()["error"]
    assert needle in err["message"] and set(err) == {"message", "type", "param", "code"}


def test_wrong_method_is_a_json_405(server: Server) -> None:
    r = httpx.get(server.url + "/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_concurrency_8_queues_and_keeps_answering(server: Server, tmp_path: Path) -> None:
    res = run_probe(ProbeConfig(url=server.url, n=12, concurrency=8, prompt_tokens=16, max_tokens=6,
                                ignore_eos=True, progress=False, out=tmp_path / "c8"))
    assert all(r.ok for r in res.results), [r.error for r in res.results if r.error]
    ids = {r.request_id for r in res.results}
    t = poll_trace(server.trace, lambda t: ids <= set(t.table("requests").column("request_id").to_pylist()))
    queued = [rid for rid, d in span_durations(t).items() if rid in ids and d.get("queue", 0) > 1_000_000]
    assert len(queued) >= 4  # 8 in flight, 4 batch slots: at least four waited over a millisecond
    assert httpx.get(f"{server.url}/models").status_code == 200  # still answering after the burst
    again = run_probe(ProbeConfig(url=server.url, n=2, max_tokens=3, ignore_eos=True, progress=False))
    assert all(r.ok for r in again.results)
