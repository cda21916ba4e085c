"""Token counts right: the server's usage first, --tokenizer otherwise; cached prompt
tokens from prompt_tokens_details; content chunks only; reasoning tokens kept apart.

The server is a uvicorn app streaming as vLLM does (tests/serving/recording_double.py): a role chunk
and an empty-content chunk (neither is a token), reasoning_content chunks, content chunks, and a usage
chunk with prompt_tokens_details.cached_tokens and completion_tokens_details.reasoning_tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.serving.recording_double import RecordingServer, UvicornThread
from tracetool.reader import open_trace
from tracetool.serving import probe_events
from tracetool.serving.probe import RequestResult


def _probe(cli: Any, srv: RecordingServer, tmp_path: Path,
           *extra: Any) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    out = tmp_path / "t"
    with UvicornThread(srv.app()) as s:
        r = cli("probe", s.url, "-n", 2, "--concurrency", 1, "--prompt-tokens", 6, "-q", "--json", "-o", out, *extra)
    assert r.code == 0, r.err
    trace = open_trace(out)
    return json.loads(r.out), trace.table("requests").to_pylist(), trace.table("tokens").num_rows


def test_usage_gives_prompt_cached_and_reasoning_tokens(cli: Any, tmp_path: Path) -> None:
    srv = RecordingServer(tokens=3, reasoning=2, cached=4, prompt_tokens=9)
    rep, rows, token_rows = _probe(cli, srv, tmp_path)
    assert [(r["prompt_tokens"], r["output_tokens"], r["cached_prompt_tokens"], r["reasoning_tokens"])
            for r in rows] == [(9, 5, 4, 2)] * 2
    assert token_rows == 2 * 5  # 2 reasoning + 3 content chunks; the role and empty chunks are not tokens
    assert rep["tokens"] == {"prompt": 18, "prompt_sources": {"server": 2}, "cached_prompt": 8, "reasoning": 4}
    assert rep["output_tokens"] == 10


def test_without_usage_the_tokenizer_counts_the_prompt_and_chunks_count_the_output(
        cli: Any, tmp_path: Path, word_tokenizer: Path) -> None:
    srv = RecordingServer(tokens=3, reasoning=2, usage=False)
    rep, rows, _ = _probe(cli, srv, tmp_path, "--tokenizer", word_tokenizer)
    # --prompt-tokens 6: six words, one token each in this tokenizer
    assert [(r["prompt_tokens"], r["output_tokens"], r["cached_prompt_tokens"], r["reasoning_tokens"])
            for r in rows] == [(6, 5, None, 2)] * 2
    assert rep["tokens"] == {"prompt": 12, "prompt_sources": {"tokenizer": 2}, "cached_prompt": None,
                             "reasoning": 4}


def test_the_servers_prompt_count_wins_over_the_tokenizer(cli: Any, tmp_path: Path, word_tokenizer: Path) -> None:
    rep, rows, _ = _probe(cli, RecordingServer(prompt_tokens=11), tmp_path, "--tokenizer", word_tokenizer)
    assert [r["prompt_tokens"] for r in rows] == [11, 11]
    assert rep["tokens"]["prompt_sources"] == {"server": 2}


def test_without_usage_or_tokenizer_the_prompt_is_unknown(cli: Any, tmp_path: Path) -> None:
    rep, rows, _ = _probe(cli, RecordingServer(usage=False), tmp_path)
    assert [r["prompt_tokens"] for r in rows] == [None, None]
    assert rep["tokens"]["prompt"] is None and rep["tokens"]["prompt_sources"] == {"unknown": 2}


@pytest.mark.parametrize("bad", ["missing", "garbage"])
def test_a_bad_tokenizer_is_bad_input_and_nothing_is_sent(bad: str, cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "tok"
    if bad == "garbage":
        path.mkdir()
        (path / "tokenizer.json").write_text("{not json")
    srv = RecordingServer()
    with UvicornThread(srv.app()) as s:
        r = cli("probe", s.url, "-n", 2, "-q", "--tokenizer", path)
    assert r.code == 3
    assert len(r.err.strip().splitlines()) == 1 and str(path) in r.err, r.err
    assert srv.received == []


@pytest.mark.parametrize(("delta", "kind"), [
    ({"role": "assistant", "content": ""}, None),
    ({"content": ""}, None),
    ({"content": None}, None),
    ({"content": "hi"}, "content"),
    ({"reasoning_content": "hmm"}, "reasoning"),
    ({"reasoning": "hmm"}, "reasoning"),
    ({"reasoning_content": ""}, None),
])
def test_which_chunks_are_tokens(delta: dict[str, Any], kind: str | None) -> None:
    r = RequestResult(0, "r", 1)
    probe_events.on_event(r, json.dumps({"choices": [{"index": 0, "delta": delta}]}), 5)
    assert (len(r.token_ns), r.reasoning_chunks) == ((0, 0) if kind is None else (1, int(kind == "reasoning")))


def test_a_new_attempt_keeps_who_the_request_is_and_when_it_was_due() -> None:
    # a warm-up request sent again stays a warm-up request (it is left out of the figures)
    r = RequestResult(3, "rid", 40, intended_ns=5, dispatched_ns=6, local_prompt_tokens=9, keep_text=True, warmup=True)
    r.start_ns, r.error, r.token_ns = 7, "connection closed before the response", [8]
    again = r.new_attempt()
    assert (again.index, again.request_id, again.prompt_chars, again.intended_ns, again.dispatched_ns,
            again.local_prompt_tokens, again.keep_text, again.warmup) == (3, "rid", 40, 5, 6, 9, True, True)
    assert (again.start_ns, again.error, again.token_ns) == (0, None, [])
    again.token_ns.append(11)
    r.become(again)
    assert r.token_ns == [11] and r.error is None and r.warmup
