"""GenAI-Perf profile_export.json imports with GenAI-Perf's own TTFT and chunk times."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc

from tracetool.reader import open_trace

FIX = Path(__file__).parent / "fixtures"


def _rows(trace, table, rid):
    t = trace.table(table)
    return t.filter(pc.equal(t.column("request_id"), rid)).to_pylist()


def _has_content(response: str) -> bool:
    """GenAI-Perf's rule (llm_profile_data_parser._preprocess_response): a response counts
    when one of its SSE events carries non-empty delta content."""
    for event in response.strip().split("\n\n"):
        body = event.strip().removeprefix("data:").strip()
        if not body or body == "[DONE]":
            continue
        if json.loads(body)["choices"][0].get("delta", {}).get("content"):
            return True
    return False


def _import(cli, tmp_path: Path, name: str) -> Path:
    out = tmp_path / "trace"
    r = cli("import", "genai-perf", FIX / name, "-o", out)
    assert r.code == 0, r.err
    assert cli("validate", out).code == 0
    return out


def test_openai_stream_matches_genai_perf_definitions(cli, tmp_path: Path) -> None:
    src = json.loads((FIX / "genai_perf_openai_profile_export.json").read_text())
    trace = open_trace(_import(cli, tmp_path, "genai_perf_openai_profile_export.json"))
    requests = src["experiments"][0]["requests"]
    assert trace.table("requests").num_rows == len(requests)
    for i, req in enumerate(requests):
        content = [t for t, o in zip(req["response_timestamps"], req["response_outputs"], strict=True)
                   if _has_content(o["response"])]
        (span,) = _rows(trace, "spans", str(i))
        assert span["start_ns"] == req["timestamp"]  # epoch ns, kept as they are
        assert span["end_ns"] == content[-1]  # GenAI-Perf's request latency ends at the last content response
        toks = sorted(_rows(trace, "tokens", str(i)), key=lambda t: t["index"])
        assert [t["emit_ns"] for t in toks] == content
        assert toks[0]["emit_ns"] - req["timestamp"] == content[0] - req["timestamp"]  # TTFT, exactly
        (row,) = _rows(trace, "requests", str(i))
        assert row["output_tokens"] == len(content)
        prompt = json.loads(req["request_inputs"]["payload"])["messages"][0]["content"]
        assert row["prompt_chars"] == len(prompt)
        assert row["prompt_tokens"] is None  # no tokenizer offline, no usage in the stream
    # request 4 received two SSE events in one read: one response, one token row
    assert len(_rows(trace, "tokens", "4")) == sum(
        _has_content(o["response"]) for o in requests[4]["response_outputs"])
    notes = " | ".join(trace.meta["notes"])
    assert "not measurable" in notes and "content responses only" in notes
    assert "output_tokens counts streamed content responses" in notes
    assert trace.meta["import"]["timeline"] == "epoch"
    assert trace.meta["import"]["service_kind"] == "openai"


def test_triton_two_experiments(cli, tmp_path: Path) -> None:
    src = json.loads((FIX / "genai_perf_triton_profile_export.json").read_text())
    trace = open_trace(_import(cli, tmp_path, "genai_perf_triton_profile_export.json"))
    ids = trace.table("requests").column("request_id").to_pylist()
    assert sorted(ids) == sorted([f"concurrency1-{i}" for i in range(3)] + [f"request_rate2.0-{i}" for i in range(3)])
    for req, rid in ((src["experiments"][1]["requests"][2], "request_rate2.0-2"),
                     (src["experiments"][0]["requests"][0], "concurrency1-0")):
        toks = sorted(_rows(trace, "tokens", rid), key=lambda t: t["index"])
        assert [t["emit_ns"] for t in toks] == req["response_timestamps"]
        (row,) = _rows(trace, "requests", rid)
        assert row["prompt_chars"] == len(req["request_inputs"]["text_input"])
    assert any("experiments are merged" in n for n in trace.meta["notes"])


def test_partial_file(cli, tmp_path: Path) -> None:
    out = tmp_path / "trace"
    r = cli("import", "genai-perf", FIX / "partial_genai_perf.json", "-o", out)
    assert r.code == 0 and "2 request(s) skipped" in r.err
    trace = open_trace(out, strict=True)
    notes = trace.meta["notes"]
    assert "skipped 1 request (1): 8 response_timestamps but 9 response_outputs" in notes
    assert "skipped 1 request (2): timestamp is a string, not a number" in notes
    (row,) = _rows(trace, "requests", "3")  # only a role chunk and [DONE]: no content
    assert row["status"] == "error" and "no response with content" in row["error"]
    assert _rows(trace, "spans", "3") == []


def test_usage_chunk_gives_token_counts(cli, tmp_path: Path) -> None:
    src = json.loads((FIX / "genai_perf_openai_profile_export.json").read_text())
    req = src["experiments"][0]["requests"][0]
    usage = {"id": "x", "object": "chat.completion.chunk", "choices": [],
             "usage": {"prompt_tokens": 311, "completion_tokens": 40, "total_tokens": 351}}
    req["response_outputs"].insert(-1, {"response": "data: " + json.dumps(usage) + "\n\n"})
    req["response_timestamps"].insert(-1, req["response_timestamps"][-2] + 1000)
    src["experiments"][0]["requests"] = [req]
    path = tmp_path / "profile_export.json"
    path.write_text(json.dumps(src))
    out = tmp_path / "t"
    assert cli("import", "genai-perf", path, "-o", out).code == 0
    trace = open_trace(out)
    (row,) = trace.table("requests").to_pylist()
    assert (row["prompt_tokens"], row["output_tokens"]) == (311, 40)
    assert trace.table("tokens").column("kv_len").null_count == trace.table("tokens").num_rows
    assert any("more output tokens than streamed chunks" in n for n in trace.meta["notes"])
