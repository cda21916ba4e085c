"""An exception at each collector hook point, in turn: generation and serving complete, the error is counted.

Each case makes one piece of collector code raise (a ``RuntimeError`` named
after the hook point) and runs the real host path through it:

* Hugging Face ``generate`` with ``instrument_hf`` (torch forward wrapper,
  torch hook method, traced generate before and after the call, the token
  streamer, the tokenizer wrappers);
* ``tracetool serve``'s app in-process (ASGI middleware at request start,
  response start, the final SSE event and the end; the engine's step
  bookkeeping), driven over real HTTP with streamed and plain requests.

The host's result must equal the result without the fault, the Recorder must
count the error, and ``meta.json`` must say ``collector errors: N``.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

import collectors.asgi as asgi
import collectors.hf.generate as hf_generate
import collectors.hf.tokenizer as hf_tokenizer
import collectors.torch_hooks as torch_hooks
from collectors import Recorder
from collectors.hf import instrument_hf, unwrap_generate, unwrap_tokenizer
from collectors.torch_hooks import HookHandle, instrument, uninstrument
from tests.faults.serve_app import App
from tracetool.reader import open_trace

PROMPTS = ["The keeper wrote the time", "Bread"]


class Injected(RuntimeError):
    """The fault a test injects (never raised by the product)."""


def boom(point: str) -> Callable[..., Any]:
    def raise_(*args: Any, **kwargs: Any) -> Any:
        raise Injected(f"injected at {point}")
    return raise_


def _only_in(fn_name: str, real: Callable[..., Any], point: str) -> Callable[..., Any]:
    """``real``, except when called from a function named ``fn_name``: then the injected fault."""
    def maybe(*args: Any, **kwargs: Any) -> Any:
        if sys._getframe(1).f_code.co_name == fn_name:
            raise Injected(f"injected at {point}")
        return real(*args, **kwargs)
    return maybe


# -- Hugging Face generate ------------------------------------------------------------------------
def _steps_feed(mp: pytest.MonkeyPatch, rec: Recorder) -> None:
    class Broken(list):  # type: ignore[type-arg]
        def append(self, item: Any) -> None:
            raise Injected("injected at torch wrapper: steps row")

    # the list the timing function hands raw steps to, taken when it is installed
    mp.setattr(rec.writer.sink("steps"), "tuple_feed", lambda convert: Broken())


def _step_ids(mp: pytest.MonkeyPatch, rec: Recorder) -> None:
    class Broken:
        def __iter__(self) -> Broken:
            return self

        def __next__(self) -> int:
            raise Injected("injected at torch wrapper: step id")

    # the ids the timing function draws a step's id from once the forward returned
    mp.setattr(torch_hooks, "_STEP_IDS", Broken())


HF_POINTS: dict[str, Callable[[pytest.MonkeyPatch, Recorder], None]] = {
    "torch wrapper: steps row": _steps_feed,
    "torch wrapper: step id": _step_ids,
    "torch hooks: pre-forward": lambda mp, rec: mp.setattr(HookHandle, "_pre", boom("pre-forward")),
    "torch hooks: post-forward": lambda mp, rec: mp.setattr(HookHandle, "_post", boom("post-forward")),
    "generate: before the call": lambda mp, rec: mp.setattr(hf_generate, "_prepare", boom("prepare")),
    "generate: after the call": lambda mp, rec: mp.setattr(hf_generate, "_record", boom("record")),
    "generate: token streamer": lambda mp, rec: mp.setattr(
        hf_generate, "now_ns", _only_in("put", hf_generate.now_ns, "streamer put")),
    "tokenizer: encode hook": lambda mp, rec: mp.setattr(
        hf_tokenizer, "_tracker", _only_in("_on_tokenize", hf_tokenizer._tracker, "tokenize hook")),
    "tokenizer: decode hook": lambda mp, rec: mp.setattr(hf_tokenizer, "_decode_rows", boom("decode rows")),
}
#: Points reached only through real torch forward hooks (``instrument(method="hooks")``).
HOOKS_METHOD = {"torch hooks: pre-forward", "torch hooks: post-forward"}


def _generate(model: Any, tok: Any) -> list[str]:
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    return list(tok.batch_decode(out, skip_special_tokens=True))


@pytest.fixture
def hf(tiny: tuple[Any, Any]) -> Iterator[tuple[Any, Any]]:
    model, tok = copy.deepcopy(tiny[0]), copy.deepcopy(tiny[1])
    yield model, tok
    unwrap_generate(model)
    unwrap_tokenizer(tok)
    uninstrument(model)


@pytest.mark.parametrize("point", sorted(HF_POINTS))
def test_hf_generate_completes_and_counts(point: str, hf: tuple[Any, Any], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = hf
    with torch.inference_mode():
        expected = _generate(model, tok)
    rec = Recorder(tmp_path / "t").start()
    if point in HOOKS_METHOD:
        instrument(model, rec, method="hooks")  # instrument_hf then keeps this handle
    HF_POINTS[point](monkeypatch, rec)
    instrument_hf(model, tok, rec)
    with torch.inference_mode():
        got = _generate(model, tok)
    monkeypatch.undo()
    rec.close()
    assert got == expected, f"{point}: the fault changed what generate returned"
    assert rec.errors >= 1, f"{point}: the fault was not counted"
    t = open_trace(tmp_path / "t", strict=True)
    assert f"collector errors: {rec.errors}" in " ".join(t.meta["notes"]), t.meta["notes"]


# -- tracetool serve's app: middleware and engine ---------------------------------------------------
SERVE_POINTS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "middleware: request start": lambda mp: mp.setattr(asgi, "request_id_from_headers", boom("request start")),
    "middleware: response start": lambda mp: mp.setattr(asgi, "server_timing_header", boom("response start")),
    "middleware: final SSE event": lambda mp: mp.setattr(asgi, "_last_json_event", boom("final SSE event")),
    "middleware: request end": lambda mp: mp.setattr(
        asgi.Recorder, "add_span", _only_in("end", asgi.Recorder.add_span, "request end")),
    "engine: step of a token": lambda mp: mp.setattr(HookHandle, "steps", boom("engine step lookup")),
}


def _ask(url: str) -> tuple[str, str]:
    body = {"model": "m", "prompt": "the river and the garden", "max_tokens": 5, "temperature": 0,
            "ignore_eos": True}
    plain = httpx.post(f"{url}/completions", json=body, timeout=60)
    assert plain.status_code == 200, plain.text
    text = plain.json()["choices"][0]["text"]
    streamed = []
    with httpx.stream("POST", f"{url}/completions", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                import json

                event = json.loads(line[6:])
                assert "error" not in event, event
                streamed += [c.get("text", "") for c in event.get("choices", [])]
    return text, "".join(streamed)


@pytest.fixture(scope="module")
def expected_answer(tiny: tuple[Any, Any], tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    app = App(tiny, tmp_path_factory.mktemp("serve") / "t")
    try:
        return _ask(app.url)
    finally:
        app.close()


@pytest.mark.parametrize("point", sorted(SERVE_POINTS))
def test_serving_completes_and_counts(point: str, tiny: tuple[Any, Any], expected_answer: tuple[str, str],
                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = App(tiny, tmp_path / "t")
    try:
        SERVE_POINTS[point](monkeypatch)
        got = _ask(app.url)
        monkeypatch.undo()
    finally:
        monkeypatch.undo()
        app.close()
    assert got == expected_answer, f"{point}: the fault changed the answer"
    assert app.rec.errors >= 1, f"{point}: the fault was not counted"
    t = open_trace(tmp_path / "t", strict=True)
    assert f"collector errors: {app.rec.errors}" in " ".join(t.meta["notes"]), t.meta["notes"]
    assert t.rows("tokens") > 0  # the rest of the recording went on
