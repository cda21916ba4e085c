"""Unit tests of the serving path's pure parts: SSE and Server-Timing parsing, metric definitions,
OpenAI request checks, URL handling."""

from __future__ import annotations

import pytest

from tracetool.errors import UsageError
from tracetool.serving.metrics import Timing, latency_metrics, stats
from tracetool.serving.openai_api import ApiError, Limits, check_lengths, parse_request
from tracetool.serving.probe import normalize_url
from tracetool.serving.sse import MalformedStream, SSEParser, parse_server_timing


def feed_all(parts: list[bytes]) -> tuple[list[str], SSEParser]:
    p = SSEParser()
    out: list[str] = []
    for part in parts:
        out += list(p.feed(part))
    out += list(p.close())
    return out, p


def test_sse_events_across_chunk_boundaries_and_line_endings() -> None:
    stream = b'data: {"a": 1}\r\n\r\n: keep-alive\n\nevent: x\ndata: line1\ndata: line2\n\ndata: [DONE]\r\r'
    whole, _ = feed_all([stream])
    assert whole == ['{"a": 1}', "line1\nline2", "[DONE]"]
    for cut in range(1, len(stream)):  # every split point gives the same events
        assert feed_all([stream[:cut], stream[cut:]])[0] == whole


def test_sse_utf8_split_between_chunks_and_last_event_without_blank_line() -> None:
    data = 'data: {"t": "héllo ✓"}\n\ndata: tail'.encode()
    i = data.index("✓".encode()) + 1  # inside the 3-byte character
    events, _ = feed_all([data[:i], data[i:]])
    assert events == ['{"t": "héllo ✓"}', "tail"]


def test_sse_non_field_lines_are_ignored_but_remembered() -> None:
    events, p = feed_all([b"garbage here\ndata: ok\n\n"])
    assert events == ["ok"] and p.junk == "garbage here"
    with pytest.raises(MalformedStream):
        feed_all([b"data: \xff\xfe\n\n"])


def test_server_timing_header() -> None:
    assert parse_server_timing('server;dur=12.5, queue;desc="wait";dur=0.25, db, cache;dur=x, server;dur=9') == \
        {"server": 12.5, "queue": 0.25}
    assert parse_server_timing("") == {}


def test_metric_definitions_match_vllm_bench_serve() -> None:
    ms = 1_000_000
    # request 1: start 0, chunks at 100, 120, 150 ms, last data event at 160, usage says 4 tokens
    # request 2: start 0, one chunk at 50 ms (a single token: no TPOT)
    t1 = Timing(0, [100 * ms, 120 * ms, 150 * ms], 160 * ms, output_tokens=4)
    t2 = Timing(0, [50 * ms], 50 * ms)
    m = latency_metrics([t1, t2])
    assert m["ttft_ms"]["mean"] == pytest.approx(75.0) and m["ttft_ms"]["n"] == 2
    assert m["e2e_ms"]["mean"] == pytest.approx(105.0)
    assert m["tpot_ms"]["n"] == 1 and m["tpot_ms"]["mean"] == pytest.approx((160 - 100) / 3)  # usage tokens
    assert m["itl_ms"]["n"] == 2 and m["itl_ms"]["mean"] == pytest.approx(25.0)  # chunk gaps, pooled
    s = stats([1.0, 2.0, 3.0, 4.0])
    assert s["p50"] == pytest.approx(2.5) and s["p90"] == pytest.approx(3.7)  # linear interpolation
    assert stats([])["mean"] is None


def test_chunks_of_one_read_are_one_arrival() -> None:
    ms = 1_000_000
    # chunks 2 and 3 came in one network read (one receipt time): one arrival, as the trace's emissions
    m = latency_metrics([Timing(0, [100 * ms, 120 * ms, 120 * ms, 150 * ms], 160 * ms)])
    assert m["itl_ms"]["n"] == 2 and m["itl_ms"]["mean"] == pytest.approx(25.0)


def test_normalize_url() -> None:
    assert normalize_url("127.0.0.1:8000", None) == ("http://127.0.0.1:8000/v1", True)
    assert normalize_url("http://h:1/v1/", None) == ("http://h:1/v1", True)
    assert normalize_url("https://h/openai/v1/completions", None) == ("https://h/openai/v1", False)
    assert normalize_url("http://h/v1/chat/completions", False) == ("http://h/v1", False)
    with pytest.raises(UsageError):
        normalize_url("ftp://h", None)


LIM = Limits(max_prompt_tokens=100, max_output_tokens=50)


@pytest.mark.parametrize(("body", "status", "param"), [
    ([1, 2], 400, None),
    ({"messages": [{"role": "user", "content": "x"}]}, 400, "model"),
    ({"model": 3, "messages": []}, 400, "model"),
    ({"model": "other", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ({"model": "m"}, 400, "messages"),
    ({"model": "m", "messages": "hi"}, 400, "messages"),
    ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, 400, "messages"),
    ({"model": "m", "messages": [{"role": "user", "content": 5}]}, 400, "messages"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}, 400, "max_tokens"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 51}, 400, "max_tokens"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": True}, 400, "max_tokens"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3}, 400, "temperature"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400, "stream"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": [1]}, 400, "stop"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream_options": {}}, 400, "stream_options"),
])
def test_chat_request_checks(body: object, status: int, param: str | None) -> None:
    with pytest.raises(ApiError) as e:
        parse_request(body, chat=True, served="m", limits=LIM)
    assert e.value.status == status and e.value.param == param
    err = e.value.body()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]


def test_good_requests_parse() -> None:
    p = parse_request({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
                       "max_completion_tokens": 7, "stream": True, "stream_options": {"include_usage": True},
                       "stop": "x", "temperature": 0, "seed": 3, "unknown_field": 1}, chat=True, served="m", limits=LIM)
    assert (p.max_tokens, p.stream, p.include_usage, p.stop, p.temperature, p.seed) == (7, True, True, ["x"], 0.0, 3)
    assert p.messages == [{"role": "user", "content": "a"}]
    c = parse_request({"model": "m", "prompt": ["one"]}, chat=False, served="m", limits=LIM)
    assert c.prompt == "one" and c.max_tokens == 16
    assert parse_request({"model": "m", "prompt": [1, 2, 3]}, chat=False, served="m", limits=LIM).prompt == [1, 2, 3]
    with pytest.raises(ApiError):
        parse_request({"model": "m", "prompt": ["a", "b"]}, chat=False, served="m", limits=LIM)


def test_length_checks() -> None:
    check_lengths(10, 10, context=100, limits=LIM)
    for prompt, out, ctx in ((0, 1, 100), (101, 1, 1000), (90, 20, 100)):
        with pytest.raises(ApiError) as e:
            check_lengths(prompt, out, context=ctx, limits=LIM)
        assert e.value.status == 400


def test_timings_unmodified_servers_put_in_the_response() -> None:
    from tracetool.serving.server_timings import SOURCE_LLAMA_CPP, SOURCE_VLLM, from_event

    # llama-server's last chunk: prompt tokens are the processed ones plus the cached ones
    rep = from_event({"choices": [], "timings": {"cache_n": 30, "prompt_n": 12, "prompt_ms": 41.5,
                                                 "predicted_n": 16, "predicted_ms": 230.25,
                                                 "predicted_per_second": 65.1}})
    assert rep is not None and rep.source == SOURCE_LLAMA_CPP
    assert (rep.phases, rep.prompt_tokens, rep.output_tokens) == ({"prefill": 41.5, "decode": 230.25}, 42, 16)
    rep = from_event({"metrics": {"queue_time_ms": 3.0, "time_to_first_token_ms": 20.0, "generation_time_ms": 90.0,
                                  "mean_itl_ms": 6.0, "tokens_per_second": 140.0}})
    assert rep is not None and rep.source == SOURCE_VLLM
    assert rep.phases == {"queue": 3.0, "prefill": 20.0, "decode": 90.0}
    # what is not a duration is not a timing; an object of another shape is no report at all
    assert from_event({"timings": {"prompt_ms": -1, "predicted_ms": float("nan")}}) is None
    assert from_event({"metrics": {"cpu": 0.5}}) is None and from_event({"timings": "fast"}) is None
    rep = from_event({"timings": {"prompt_ms": True, "predicted_ms": 10**400, "prompt_n": 2**40}})
    assert rep is None
