"""The serve engine on a tiny demo Llama: batched decode equals one-at-a-time decode, and what it records."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collectors import Recorder
from tests.serving.conftest import span_durations
from tracetool.reader import open_trace
from tracetool.serving.engine import Engine, GenRequest

TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
        "head_dim": 32, "intermediate_size": 128}
PROMPTS = ["hello world this is", "a much longer prompt with many more words in it than the other one",
           "short", "the river and the garden", "signal"]


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    import torch

    torch.set_num_threads(1)
    from collectors.demo import load_demo_model

    return load_demo_model(seed=0, **TINY)


class Run:
    """Submit requests to an engine and wait for every one to finish (an event, no sleeps)."""

    def __init__(self, engine: Engine, rec: Recorder) -> None:
        self.engine, self.rec = engine, rec
        self.events: dict[int, list[tuple[Any, ...]]] = {}
        self.jobs: list[GenRequest] = []
        self._left = 0
        self._done = threading.Event()
        self._ended: dict[int, threading.Event] = {}  # each request's own "done or error"
        self._lock = threading.Lock()

    def submit(self, ids: list[int], max_tokens: int, **kw: Any) -> GenRequest:
        i = len(self.jobs)
        self.events[i] = []
        self._ended[i] = threading.Event()

        def emit(ev: tuple[Any, ...]) -> None:
            self.events[i].append(ev)
            if ev[0] in ("done", "error"):
                self._ended[i].set()
                with self._lock:
                    self._left -= 1
                    if self._left == 0:
                        self._done.set()

        job = GenRequest(self.rec.request(f"r{i}"), ids, max_tokens, emit, **kw)
        with self._lock:
            self._left += 1
            self._done.clear()
        self.jobs.append(job)
        self.engine.submit(job)
        return job

    def wait(self) -> None:
        assert self._done.wait(120), "engine did not finish"

    def wait_for(self, i: int) -> None:
        """Until request ``i`` (in submission order) ends, whatever the others do."""
        assert self._ended[i].wait(120), f"request {i} did not finish"


@pytest.fixture
def run(tiny: tuple[Any, Any], tmp_path: Path) -> Iterator[Any]:
    made: list[tuple[Engine, Recorder]] = []

    def make(max_batch: int) -> Run:
        rec = Recorder(tmp_path / f"trace{len(made)}").start()
        eng = Engine(tiny[0], tiny[1], rec, max_batch=max_batch)
        eng.start()
        made.append((eng, rec))
        return Run(eng, rec)

    yield make
    for eng, rec in made:
        eng.close()
        rec.close()


def generate(make: Any, tok: Any, max_batch: int) -> tuple[list[list[int]], Run]:
    r = make(max_batch)
    for p in PROMPTS:
        r.submit(tok(p)["input_ids"], 10, temperature=0.0, ignore_eos=True)
    r.wait()
    return [j.generated for j in r.jobs], r


def test_batched_decode_equals_one_at_a_time(run: Any, tiny: tuple[Any, Any]) -> None:
    solo, r1 = generate(run, tiny[1], max_batch=1)
    batched, r4 = generate(run, tiny[1], max_batch=4)
    assert r1.engine.batching is False and r4.engine.batching is True
    assert batched == solo and all(len(g) == 10 for g in solo)
    r4.engine.close()
    r4.rec.close()
    steps = open_trace(r4.rec.path).table("steps").to_pylist()
    assert max(s["batch_size"] for s in steps) == 4  # requests really shared forwards
    assert sum(s["decode_tokens"] for s in steps) == 5 * 9  # every decoded token, once


def test_records_tokens_steps_and_phases_that_add_up(run: Any, tiny: tuple[Any, Any]) -> None:
    _, r = generate(run, tiny[1], max_batch=2)  # 5 requests, 2 slots: three wait in the queue
    r.engine.close()
    r.rec.close()
    t = open_trace(r.rec.path)
    tokens = t.table("tokens").to_pylist()
    steps = {s["step_id"]: s for s in t.table("steps").to_pylist()}
    prompt_len = {f"r{i}": len(tiny[1](p)["input_ids"]) for i, p in enumerate(PROMPTS)}
    assert len(tokens) == 50
    for row in tokens:
        assert row["kv_len"] == prompt_len[row["request_id"]] + row["index"]
        s = steps[row["step_id"]]  # every token names the forward pass that produced it
        assert (s["start_ns"], s["end_ns"], s["batch_size"]) == (row["step_start_ns"], row["step_end_ns"],
                                                                  row["batch_size"])
        assert s["prefill_tokens"] > 0 if row["index"] == 0 else s["decode_tokens"] > 0
    dur = span_durations(t)
    waited = [rid for rid, d in dur.items() if d["queue"] > 0]
    assert len(dur) == 5 and len(waited) >= 3
    for d in dur.values():
        assert {"queue", "prefill", "decode", "detokenize"} <= set(d)
    for rid in dur:  # decode = first -> last token, less the detokenize inside it: no double count
        emits = sorted(row["emit_ns"] for row in tokens if row["request_id"] == rid)
        spans = [s for s in t.table("spans").to_pylist() if s["request_id"] == rid]
        inside = sum(s["end_ns"] - s["start_ns"] for s in spans
                     if s["name"] == "detokenize" and emits[0] <= s["start_ns"] < emits[-1])
        assert dur[rid]["decode"] + inside == emits[-1] - emits[0]
    assert all((j.handle.prompt_tokens, j.handle.output_tokens) == (len(j.prompt_ids), 10) for j in r.jobs)


def test_stop_reasons_and_cancel(run: Any, tiny: tuple[Any, Any]) -> None:
    tok = tiny[1]
    r = run(4)
    long_job = r.submit(tok("go on")["input_ids"], 200, temperature=0.0, ignore_eos=True)
    short = r.submit(tok("stop soon")["input_ids"], 3, temperature=0.7, seed=1)
    r.engine.cancel(long_job)
    r.wait_for(1)  # the short one finishes; the cancelled one just stops
    assert r.events[1][-1][0] == "done" and r.events[1][-1][1] in ("length", "stop")
    assert len(short.generated) <= 3
    assert len(long_job.generated) < 200


def test_a_failing_forward_ends_only_its_requests(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "t").start()
    eng = Engine(tiny[0], tiny[1], rec, max_batch=2).start()
    r = Run(eng, rec)
    bad = r.submit([10 ** 6], 4)  # a token id beyond the vocabulary: the forward raises
    r.wait()
    assert r.events[0][-1][0] == "error" and "generation failed" in r.events[0][-1][1]
    good = r.submit(tiny[1]("fine")["input_ids"], 3, temperature=0.0)
    r.wait()
    assert r.events[1][-1][0] == "done" and len(good.generated) == 3 and not bad.generated
    eng.close()
    rec.close()
