"""Workloads round-trip: the prompts the server receives are the prompts in the file.

Each format's fixture in tests/serving/data/ (the examples of docs/workloads.md) is probed against a
uvicorn server that keeps every request body (tests/serving/recording_double.py), at concurrency 1 so
the order is the file's. Bad files are bad input: exit 3, one line naming the file and the line,
and nothing reaches the server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serving.recording_double import RecordingServer, UvicornThread
from tracetool.reader import open_trace

DATA = Path(__file__).parent / "data"


@pytest.fixture
def server() -> Iterator[tuple[UvicornThread, RecordingServer]]:
    srv = RecordingServer(tokens=3)
    with UvicornThread(srv.app()) as s:
        yield s, srv


def _run(cli: Any, server: Any, *args: Any) -> list[dict[str, Any]]:
    s, srv = server
    r = cli("probe", s.url, "--concurrency", 1, "-q", *args)
    assert r.code == 0, r.err
    return srv.received


def _user_texts(bodies: list[dict[str, Any]]) -> list[str]:
    return [b["messages"][-1]["content"] for b in bodies]


def test_sharegpt_first_human_turns(cli: Any, server: Any) -> None:
    got = _run(cli, server, "--dataset", DATA / "sharegpt.json")
    # the conversation that opens with the assistant has no human turn: skipped
    want = ["What is the capital of France?", "Write a haiku about\nlatency, over two lines."]
    assert _user_texts(got) == want
    assert [len(b["messages"][0]["content"]) for b in got] == [len(w) for w in want]


def test_jsonl_prompts_and_max_tokens(cli: Any, server: Any) -> None:
    got = _run(cli, server, "--dataset", DATA / "prompts.jsonl", "--completions", "--max-tokens", 9)
    lines = [json.loads(ln) for ln in (DATA / "prompts.jsonl").read_text().splitlines() if ln.strip()]
    assert [b["prompt"] for b in got] == [ln["prompt"] for ln in lines]
    assert [b["max_tokens"] for b in got] == [ln.get("max_tokens", 9) for ln in lines]


def test_jsonl_messages_are_sent_as_they_are(cli: Any, server: Any) -> None:
    got = _run(cli, server, "--dataset", DATA / "messages.jsonl")
    lines = [json.loads(ln) for ln in (DATA / "messages.jsonl").read_text().splitlines()]
    assert [b["messages"] for b in got] == [ln["messages"] for ln in lines]
    assert got[1]["max_tokens"] == 4


def test_plain_text_one_prompt_per_line_cycled_to_n(cli: Any, server: Any) -> None:
    got = _run(cli, server, "--dataset", DATA / "prompts.txt", "-n", 3)
    lines = [ln for ln in (DATA / "prompts.txt").read_text().splitlines() if ln.strip()]
    assert _user_texts(got) == [lines[0], lines[1], lines[0]]


def test_vllm_timed_trace_replays_lengths_turns_and_times(cli: Any, server: Any, tmp_path: Path) -> None:
    out = tmp_path / "t"
    got = _run(cli, server, "--replay", DATA / "timed_trace.jsonl", "--time-scale", 0.5, "-o", out)
    # line 2 is a conversation of two queries: its second turn carries the first and its answer
    assert len(got) == 4
    words = [len(b["messages"][-1]["content"].split()) for b in got]
    assert sorted(zip(words, [b["max_tokens"] for b in got], strict=True)) == sorted([(12, 3), (5, 2), (4, 2), (20, 4)])
    second = next(b for b in got if len(b["messages"]) == 3)
    assert second["messages"][1] == {"role": "assistant", "content": " w0 w1 w2"}
    # intended send times: the file's timestamps, scaled (the first turns of the three lines)
    spans = open_trace(out).table("spans").to_pylist()
    starts = sorted(s["start_ns"] for s in spans if s["name"] == "client.queue")
    first_turns = [starts[0], *[t for t in starts[1:] if t - starts[0] in (50_000_000, 125_000_000)]]
    assert [t - starts[0] for t in first_turns] == [0, 50_000_000, 125_000_000]
    meta = json.loads((out / "meta.json").read_text())["probe"]["workload"]
    assert (meta["source"], meta["time_scale"], meta["conversations"]) == ("replay", 0.5, 3)
    assert meta["lengths"].startswith("approximate")


def test_mooncake_shared_hash_ids_share_their_prefix(cli: Any, server: Any) -> None:
    got = _run(cli, server, "--replay", DATA / "mooncake.jsonl")
    texts = [b["messages"][0]["content"].split() for b in got]
    assert [len(t) for t in texts] == [600, 530, 40]
    assert [b["max_tokens"] for b in got] == [3, 2, 2]
    assert texts[0][:512] == texts[1][:512]  # hash id 46: one 512-token block, the same text
    assert texts[0][512:530] != texts[1][512:530]  # 47 and 48 differ
    assert texts[2] != texts[0][:40]


def test_synthetic_lengths_exact_with_a_tokenizer(cli: Any, server: Any, word_tokenizer: Path, tmp_path: Path) -> None:
    out = tmp_path / "t"
    got = _run(cli, server, "-n", 20, "--input-len", "10:3", "--output-len", "6:2", "--tokenizer", word_tokenizer,
               "--seed", 4, "-o", out)
    lens = [len(b["messages"][0]["content"].split()) for b in got]  # this tokenizer: one token per word
    assert min(lens) >= 1 and len(set(lens)) > 1 and sum(lens) / len(lens) == pytest.approx(10, abs=2)
    assert len({b["max_tokens"] for b in got}) > 1
    rows = open_trace(out).table("requests").to_pylist()
    assert sorted(r["prompt_tokens"] for r in rows) == sorted([7] * 20)  # the server's usage wins
    meta = json.loads((out / "meta.json").read_text())["probe"]["workload"]
    assert meta["lengths"] == f"tokenizer {word_tokenizer}" and meta["input_len"] == [10, 3.0]


def test_prefix_len_shares_one_prefix(cli: Any, server: Any) -> None:
    got = _run(cli, server, "-n", 3, "--prefix-len", 5, "--input-len", 4)
    words = [b["messages"][0]["content"].split() for b in got]
    assert all(len(w) == 9 for w in words)
    assert words[0][:5] == words[1][:5] == words[2][:5]
    assert len({tuple(w[5:]) for w in words}) == 3


def test_turns_carry_the_history(cli: Any, server: Any) -> None:
    got = _run(cli, server, "-n", 2, "--turns", 3, "--input-len", 3)
    assert len(got) == 6
    last = [b for b in got if len(b["messages"]) == 5]
    assert len(last) == 2
    roles = [m["role"] for m in last[0]["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    assert last[0]["messages"][1]["content"] == " w0 w1 w2"


@pytest.mark.parametrize(("name", "content", "where"), [
    ("bad.jsonl", '{"prompt": "ok"}\n{"prompt": \n', "bad.jsonl:2: not a JSON object"),
    ("shape.jsonl", '{"prompt": "ok"}\n{"text": "no prompt"}\n', "shape.jsonl:2: expected a non-empty 'prompt'"),
    ("empty.txt", "\n\n", "empty.txt: no prompts"),
    ("bad.json", '[{"conversations": [\n{"from": "human", "value": "x"},\n]}]', "bad.json:3: not valid JSON"),
    ("replay.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": "x"}\n',
     "replay.jsonl:2: no numeric 'timestamp'"),
    ("replay2.jsonl", '{"timestamp": 0, "input_length": -5, "output_length": 1}\n',
     "replay2.jsonl:1: 'input_length' must be a positive integer"),
    ("missing.jsonl", None, "missing.jsonl: cannot read"),
])
def test_bad_files_exit_3_naming_file_and_line_and_send_nothing(name: str, content: str | None, where: str,
                                                                cli: Any, server: Any, tmp_path: Path) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    flag = "--replay" if name.startswith("replay") else "--dataset"
    s, srv = server
    r = cli("probe", s.url, "-q", flag, path)
    assert r.code == 3, (r.code, r.err)
    assert len(r.err.strip().splitlines()) == 1 and where in r.err, r.err
    assert srv.received == []


@pytest.mark.parametrize(("args", "said"), [
    (["--input-len", "ten"], "--input-len 'ten': expected N or N:STD"),
    (["--output-len", "0"], "N must be >= 1"),
    (["--replay", DATA / "mooncake.jsonl", "--rate", "2"], "--rate does not apply"),
    (["--dataset", DATA / "prompts.txt", "--replay", DATA / "mooncake.jsonl"], "pick one of"),
    (["--turns", "2", "--completions"], "--turns needs the chat endpoint"),
])
def test_bad_options_exit_2(args: list[Any], said: str, cli: Any, server: Any) -> None:
    s, srv = server
    r = cli("probe", s.url, "-q", *args)
    assert r.code == 2 and said in r.err, (r.code, r.err)
    assert srv.received == []


def test_approximate_lengths_are_labelled_in_the_report(cli: Any, server: Any) -> None:
    s, _ = server
    r = cli("probe", s.url, "-n", 2, "--input-len", 5, "-q", "--json")
    assert r.code == 0, r.err
    wl = json.loads(r.out)["workload"]
    assert (wl["source"], wl["input_len"]) == ("synthetic", [5, 0.0]) and wl["lengths"].startswith("approximate")
    text = cli("probe", s.url, "-n", 1, "--input-len", 5, "-q")
    assert "lengths approximate (no --tokenizer" in text.out
