"""Hugging Face generate traced per request and per token (the demo Llama at a tiny shape)."""

from __future__ import annotations

import copy
from collections import Counter, defaultdict
from typing import Any

import pytest
import torch

from collectors.hf import instrument_hf, traced_generate, unwrap_generate, wrap_tokenizer
from collectors.torch_hooks import uninstrument

PROMPTS = ["The keeper wrote the time", "Bread"]


@pytest.fixture
def hf(tiny: tuple[Any, Any]) -> tuple[Any, Any]:
    return copy.deepcopy(tiny[0]), copy.deepcopy(tiny[1])


def by_request(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[r["request_id"]].append(r)
    return out


def test_batch_of_two_prompts_is_two_requests_with_exact_token_rows(hf: Any, recorder: Any, read: Any) -> None:
    model, tok = hf
    rec = recorder()
    instrument_hf(model, tok, rec)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=7, min_new_tokens=7, do_sample=False)
    texts = tok.batch_decode(out, skip_special_tokens=True)
    t = read(rec)
    assert len(texts) == 2
    prompt_lens = [int(n) for n in enc["attention_mask"].sum(-1)]
    assert prompt_lens[0] != prompt_lens[1]  # padding must not leak into kv_len

    tokens = by_request(t.table("tokens").to_pylist())
    assert len(tokens) == 2
    steps = {r["step_id"]: r for r in t.table("steps").to_pylist()}
    for rid, plen in zip(sorted(tokens), prompt_lens, strict=True):
        rows = sorted(tokens[rid], key=lambda r: r["index"])
        assert [r["index"] for r in rows] == list(range(7))
        assert [r["kv_len"] for r in rows] == [plen + i for i in range(7)]
        assert all(r["step_end_ns"] > r["step_start_ns"] for r in rows)
        assert all(r["batch_size"] == 2 for r in rows)
        assert [steps[r["step_id"]]["prefill_tokens"] > 0 for r in rows] == [True] + [False] * 6
        assert all(r["step_end_ns"] <= r["emit_ns"] for r in rows)
        emits = [r["emit_ns"] for r in rows]
        assert emits == sorted(emits)

    spans = t.table("spans").to_pylist()
    names = Counter((s["request_id"], s["name"]) for s in spans)
    for rid in tokens:
        for name in ("tokenize", "prefill", "decode", "detokenize", "server.request"):
            assert names[(rid, name)] == 1, (rid, name)
    for rid, ss in by_request(spans).items():
        span = {s["name"]: s for s in ss}
        first, last = min(r["emit_ns"] for r in tokens[rid]), max(r["emit_ns"] for r in tokens[rid])
        assert span["prefill"]["end_ns"] == first and span["decode"]["start_ns"] == first
        assert span["decode"]["end_ns"] == last
        assert span["server.request"]["start_ns"] == span["tokenize"]["start_ns"]
        assert span["server.request"]["end_ns"] == span["detokenize"]["end_ns"]
    reqs = {r["request_id"]: r for r in t.table("requests").to_pylist()}
    assert [reqs[rid]["output_tokens"] for rid in sorted(reqs)] == [7, 7]
    assert [reqs[rid]["prompt_tokens"] for rid in sorted(reqs)] == prompt_lens
    assert [reqs[rid]["prompt_chars"] for rid in sorted(reqs)] == [len(p) for p in PROMPTS]
    assert t.meta["model"]["layers"] == 1 and t.meta["hardware"]["device"] == "cpu"


def test_single_prompt_with_max_new_tokens(hf: Any, recorder: Any, read: Any) -> None:
    model, tok = hf
    rec = recorder()
    enc = tok("A river is never the same", return_tensors="pt")
    traced_generate(model, rec, **enc, max_new_tokens=12, min_new_tokens=12)
    t = read(rec)
    rows = t.table("tokens").to_pylist()
    n = enc["input_ids"].shape[1]
    assert sorted((r["index"], r["kv_len"]) for r in rows) == [(i, n + i) for i in range(12)]
    assert sum(1 for s in t.table("spans").to_pylist() if s["name"] == "prefill") == 1
    # the hooks' own kv_len reading (from the cache) agrees with the convention
    steps = sorted(t.table("steps").to_pylist(), key=lambda r: r["step_id"])
    assert [s["kv_tokens"] for s in steps] == [n + i for i in range(12)]


def test_rows_stop_at_their_first_eos(hf: Any, recorder: Any, read: Any) -> None:
    model, tok = hf
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    plain = model.generate(**enc, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    gen = plain[:, enc["input_ids"].shape[1]:].tolist()
    # an id row 0 emits at some step that row 1 never emits: make it the EOS
    k, eos = next((i, t) for i, t in enumerate(gen[0]) if i >= 2 and t not in gen[1])
    first = gen[0].index(eos)
    rec = recorder()
    traced_generate(model, rec, **enc, max_new_tokens=8, do_sample=False, eos_token_id=eos,
                    pad_token_id=tok.pad_token_id)
    counts = Counter(r["request_id"] for r in read(rec).table("tokens").to_pylist())
    assert sorted(counts.values()) == sorted([first + 1, 8]) and k >= first


def test_faults_in_the_writer_do_not_break_generation(hf: Any, recorder: Any, monkeypatch: Any) -> None:
    import tracetool.writer as writer

    model, tok = hf
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    ref = model.generate(**enc, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    rec = recorder()

    def disk_full(self: Any, batch: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer.StreamFile, "write_batch", disk_full)
    monkeypatch.setattr(rec, "tokens", lambda cols: (_ for _ in ()).throw(RuntimeError("sink bug")))
    out = traced_generate(model, rec, **enc, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    torch.testing.assert_close(out, ref)
    rec.writer.flush()
    rec.close()
    assert rec.errors >= 1
    assert rec.writer.failed is not None


def test_user_streamer_still_receives_every_put(hf: Any, recorder: Any, read: Any) -> None:
    from transformers.generation.streamers import BaseStreamer

    class Collect(BaseStreamer):
        def __init__(self) -> None:
            self.puts: list[list[int]] = []
            self.ended = False

        def put(self, value: Any) -> None:
            self.puts.append(value.reshape(-1).tolist())

        def end(self) -> None:
            self.ended = True

    model, tok = hf
    rec = recorder()
    s = Collect()
    enc = tok("Gulls stood on the railings", return_tensors="pt")
    out = traced_generate(model, rec, **enc, max_new_tokens=5, min_new_tokens=5, streamer=s)
    assert s.ended and len(s.puts) == 6  # the prompt, then one per token
    assert [t for put in s.puts[1:] for t in put] == out[0, enc["input_ids"].shape[1]:].tolist()
    assert read(rec).rows("tokens") == 5


def test_decodes_inside_generate_do_not_count_as_detokenize(hf: Any, recorder: Any, read: Any) -> None:
    from transformers import TextStreamer

    model, tok = hf
    rec = recorder()
    instrument_hf(model, tok, rec)
    enc = tok("Notes on rivers", return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=4, min_new_tokens=4, streamer=TextStreamer(tok))
    tok.decode(out[0])
    names = Counter(s["name"] for s in read(rec).table("spans").to_pylist())
    assert names["detokenize"] == 1 and names["stream.detokenize"] >= 4
    assert names["decode"] == 1


def test_beam_search_records_tokens_from_steps(hf: Any, recorder: Any, read: Any) -> None:
    model, tok = hf
    rec = recorder()
    enc = tok("Every queue has its own rhythm", return_tensors="pt")
    traced_generate(model, rec, **enc, max_new_tokens=4, min_new_tokens=4, num_beams=2)
    rows = read(rec).table("tokens").to_pylist()
    assert sorted(r["index"] for r in rows) == [0, 1, 2, 3]
    assert all(r["step_id"] is not None for r in rows)


def test_errors_inside_generate_propagate_and_are_recorded(hf: Any, recorder: Any, read: Any) -> None:
    model, tok = hf
    rec = recorder()
    enc = tok("Put a large bowl near the stove", return_tensors="pt")
    with pytest.raises(ValueError):
        traced_generate(model, rec, **enc, max_new_tokens=3, num_beams=2, num_return_sequences=3)
    reqs = read(rec).table("requests").to_pylist()
    assert len(reqs) == 1 and reqs[0]["status"] == "error" and "ValueError" in reqs[0]["error"]


def test_disabled_recorder_records_nothing_and_changes_nothing(hf: Any, recorder: Any, read: Any) -> None:
    model, tok = hf
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    ref = model.generate(**enc, max_new_tokens=4, do_sample=False)
    rec = recorder(enabled=False)
    instrument_hf(model, tok, rec)
    torch.testing.assert_close(model.generate(**enc, max_new_tokens=4, do_sample=False), ref)
    unwrap_generate(model)
    uninstrument(model)
    t = read(rec)
    assert t.rows("tokens") == 0 and t.rows("steps") == 0


def test_an_open_request_context_names_the_request(hf: Any, recorder: Any, read: Any) -> None:
    model, tok = hf
    rec = recorder()
    wrap_tokenizer(tok, rec)
    with rec.request("chat-42") as req:
        enc = tok("The clockmaker says", return_tensors="pt")
        traced_generate(model, rec, **enc, max_new_tokens=3, min_new_tokens=3)
        assert req.output_tokens == 3
        assert "prefill" in req.durations_ns and "tokenize" in req.durations_ns
    t = read(rec)
    assert {r["request_id"] for r in t.table("tokens").to_pylist()} == {"chat-42"}
    assert "server.request" not in {s["name"] for s in t.table("spans").to_pylist()}  # the caller owns it
    assert t.table("requests").to_pylist()[0]["output_tokens"] == 3


def test_explicit_request_ids_for_a_batch(hf: Any, recorder: Any, read: Any) -> None:
    model, tok = hf
    rec = recorder()
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    traced_generate(model, rec, **enc, max_new_tokens=2, min_new_tokens=2, request_ids=["a", "b"])
    t = read(rec)
    assert Counter(r["request_id"] for r in t.table("tokens").to_pylist()) == {"a": 2, "b": 2}


def test_decode_of_one_row_goes_to_that_request(hf: Any, recorder: Any, read: Any) -> None:
    model, tok = hf
    rec = recorder()
    instrument_hf(model, tok, rec)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    tok.decode(out[1])
    tok.decode(out[0].tolist())  # a list: matched by content
    det = [s["request_id"] for s in read(rec).table("spans").to_pylist() if s["name"] == "detokenize"]
    assert det == ["gen1-1", "gen1-0"]


@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_decode_of_a_tolist_row_with_pads_after_its_eos(hf: Any, recorder: Any, read: Any, pad_is_eos: bool) -> None:
    """Seen with SmolLM2-135M under ``tracetool record``: a batch whose first row stopped on EOS
    and was padded to the batch's length, decoded as ``out.tolist()[r][n:]``, got no detokenize
    span (the pads after the EOS defeated the suffix match). SmolLM2's pad id is its EOS id."""
    model, tok = hf
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    n = enc["input_ids"].shape[1]
    plain = model.generate(**enc, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    gen = plain[:, n:].tolist()
    eos = next(t for i, t in enumerate(gen[0]) if i >= 2 and t not in gen[1])  # row 0 stops early
    pad = eos if pad_is_eos else tok.pad_token_id
    rec = recorder()
    instrument_hf(model, tok, rec)
    out = model.generate(**enc, max_new_tokens=8, do_sample=False, eos_token_id=eos, pad_token_id=pad)
    rows = out.tolist()
    assert rows[0][-1] == pad and rows[0][n:].count(eos) >= 1  # the shape the real run had
    for row in rows:
        tok.decode(row[n:], skip_special_tokens=True)
    det = [s["request_id"] for s in read(rec).table("spans").to_pylist() if s["name"] == "detokenize"]
    assert det == ["gen1-0", "gen1-1"]


def test_memory_is_bounded_and_drops_are_counted(hf: Any, recorder: Any, read: Any) -> None:
    model, tok = hf
    rec = recorder(max_pending_rows=5, flush_interval_s=3600)  # nothing flushes during the call
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    traced_generate(model, rec, **enc, max_new_tokens=7, min_new_tokens=7, do_sample=False)
    t = read(rec)
    assert t.meta["dropped_rows"]["steps"] == 2  # 7 steps, room for 5
    assert t.meta["dropped_rows"]["tokens"] == 14  # one batch of 14 rows does not fit: all counted
    assert t.rows("steps") == 5
