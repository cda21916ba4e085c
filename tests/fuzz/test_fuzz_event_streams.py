"""Fuzzing the probe's reader of server event streams (the bytes any OpenAI-compatible server sends).

In-process, on many examples: mutated streams from ``corpus/sse`` cut into
random network chunks go through :class:`SSEParser` and the probe's event
handler; only :class:`MalformedStream` may escape, and the rows written for
the request must all land (no collector error). Over real sockets, on a
share: a server answering with the fuzzed bytes, and the whole
``tracetool probe`` run must finish with exit 0 and one requests row.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collectors.recorder import Recorder
from tests.fuzz.fuzzlib import CORPUS, assert_clean, fuzz_settings, run_cli, tried
from tests.fuzz.mutators import BYTE_OPS, JSON_VALUES, mutate_bytes, mutated_json
from tracetool.reader import open_trace
from tracetool.serving.probe import ProbeConfig, Prober, RequestResult
from tracetool.serving.probe_trace import write_request
from tracetool.serving.sse import MalformedStream, SSEParser, parse_server_timing

SEEDS = sorted((CORPUS / "sse").glob("*.txt"))


def _events(raw: bytes) -> list[str]:
    return [ln[6:] for ln in raw.decode().split("\n") if ln.startswith("data: ")]


@st.composite
def stream_bytes(draw: Any) -> bytes:
    seed = draw(st.sampled_from(SEEDS)).read_bytes()
    how = draw(st.sampled_from(["events", "events", "bytes", "lines"]))
    if how == "bytes":
        return mutate_bytes(seed, draw(st.lists(BYTE_OPS, min_size=1, max_size=5)))
    events = _events(seed)
    if how == "lines":  # SSE framing itself: odd fields, CR/CRLF, comments, missing blank lines
        extra = draw(st.lists(st.sampled_from([b": keep-alive", b"event: x", b"id: 1", b"retry: 5", b"data:",
                                               b"data", b"\r", b"\r\n", b"", b"garbage line", b"data:  [DONE]",
                                               b"data: {}", b"\xff\xfe", b"data: [DONE]trailing"]),
                              max_size=6))
        parts = [f"data: {e}".encode() for e in events]
        for x in extra:
            parts.insert(draw(st.integers(0, len(parts))), x)
        sep = draw(st.sampled_from([b"\n\n", b"\r\n\r\n", b"\r\r", b"\n"]))
        return sep.join(parts) + sep
    out = []
    if draw(st.integers(0, 3)) == 0:  # the numbers a server reports back: usage and timings
        fields = {k: draw(st.one_of(st.sampled_from([-1, 0, 2**31, 2**63, 2**70, 1e400, "7"]), JSON_VALUES))
                  for k in draw(st.lists(st.sampled_from(["completion_tokens", "prompt_tokens", "server", "queue",
                                                          "decode"]), min_size=1, unique=True))}
        usage = {k: v for k, v in fields.items() if k.endswith("_tokens")}
        timing = {k: v for k, v in fields.items() if not k.endswith("_tokens")}
        # and as unmodified servers report them: llama.cpp's timings, vLLM's per-request metrics
        hostile = st.one_of(st.sampled_from([-1, 0, 2**31, 2**63, 1e400, "7", None]), JSON_VALUES)
        llama = {k: draw(hostile) for k in draw(st.lists(st.sampled_from(
            ["prompt_ms", "predicted_ms", "prompt_n", "cache_n", "predicted_n"]), unique=True))}
        vllm = {k: draw(hostile) for k in draw(st.lists(st.sampled_from(
            ["queue_time_ms", "time_to_first_token_ms", "generation_time_ms"]), unique=True))}
        events.insert(len(events) - 1, json.dumps({"choices": [], "usage": usage, "server_timing": timing,
                                                   "timings": llama, "metrics": vllm}, allow_nan=True))
    for e in events:
        if e != "[DONE]" and draw(st.integers(0, 2)) == 0:
            e = json.dumps(draw(mutated_json(json.loads(e))), allow_nan=True)
        elif draw(st.integers(0, 9)) == 0:
            e = json.dumps(draw(JSON_VALUES), allow_nan=True)
        out.append(f"data: {e}\n\n".encode())
    return b"".join(out)


def _chunks(data: bytes, cuts: list[float]) -> list[bytes]:
    points = sorted({int(c * len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@fuzz_settings(3.0)
@given(stream_bytes(), st.lists(st.floats(0, 1), max_size=8))
def test_parser_and_event_handler(data: bytes, cuts: list[float]) -> None:
    _record_and_check(_probe_events(data, cuts))
    tried("event streams (in-process)")


def _probe_events(data: bytes, cuts: list[float]) -> RequestResult:
    """The probe's parser and event handler over ``data`` arriving in pieces cut at ``cuts``."""
    prober = Prober(ProbeConfig(url="http://127.0.0.1:9/v1", progress=False))
    r = RequestResult(0, "r0", 10, start_ns=1_000_000, end_ns=0)
    parser = SSEParser()
    t = 2_000_000
    try:
        for piece in _chunks(data, cuts):
            t += 1000
            for event in parser.feed(piece):
                prober._on_event(r, event, t)
        for event in parser.close():
            prober._on_event(r, event, t)
    except MalformedStream as e:
        r.fail(f"malformed SSE: {e}")
    r.end_ns = t + 1000
    return r


def _record_and_check(r: RequestResult) -> None:
    """The request's rows written as the probe writes them: none lost, the trace valid."""
    with tempfile.TemporaryDirectory(prefix="tracetool-fuzz-") as tmp:
        rec = Recorder(Path(tmp) / "t").start()
        write_request(rec, r)
        rec.close()
        assert rec.errors == 0, "rows of a fuzzed response were lost"
        trace = open_trace(Path(tmp) / "t", strict=True)
        assert trace.rows("requests") == 1 and trace.rows("tokens") == len(r.token_ns)


@fuzz_settings(1.0)
@given(st.text(max_size=80))
def test_server_timing_header(value: str) -> None:
    for ms in parse_server_timing(value).values():
        assert ms >= 0 and ms != float("inf")
    tried("Server-Timing headers")


class _Replay:
    """A loopback server answering every POST with the same fuzzed bytes (after a valid header)."""

    def __init__(self) -> None:
        self.body = b""
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        srv = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = srv.sockets[0].getsockname()[1]
        self._ready.set()
        loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            n = next((int(ln.split(b":")[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")),
                     0)
            await reader.readexactly(n)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + self.body)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


_SERVER: list[_Replay] = []


@fuzz_settings(0.1, floor=8)
@given(stream_bytes())
def test_probe_over_a_socket(data: bytes) -> None:
    if not _SERVER:
        _SERVER.append(_Replay())
    srv = _SERVER[0]
    srv.body = data
    with tempfile.TemporaryDirectory(prefix="tracetool-fuzz-") as tmp:
        r = run_cli("probe", f"http://127.0.0.1:{srv.port}/v1", "--served-model-name", "m", "-n", 1, "--timeout", 5,
                    "-q", "-o", Path(tmp) / "t")
        assert_clean(r, allowed=(0,))
        assert open_trace(Path(tmp) / "t", strict=True).rows("requests") == 1
    tried("event streams (socket)")


@pytest.mark.parametrize("timing", [
    {"server": 1.797693134862316e+302},  # finite, but x1e6 ns is infinity: was an OverflowError traceback
    {"queue": 9223372036854775808, "server": 0},  # 2**63 ms: a span out of int64 range, a lost row
    {"server": 2e9, "decode": 1e9 + 1},
])
def test_absurd_but_finite_server_timing_is_no_timing(timing: dict[str, float]) -> None:
    """Found by the random campaign (TRACETOOL_FUZZ_RANDOM=1, 2,000 examples)."""
    data = (b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
            + f'data: {json.dumps({"choices": [], "server_timing": timing})}\n\n'.encode() + b"data: [DONE]\n\n")
    r = _probe_events(data, [])
    assert r.server_timing is None or all(v <= 1e9 for v in r.server_timing.values())
    assert len(r.token_ns) == 1
    _record_and_check(r)
