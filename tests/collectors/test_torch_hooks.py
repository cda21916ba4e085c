"""instrument()/uninstrument() on real modules: steps rows, classification, safety, CUDA event mapping."""

from __future__ import annotations

import copy
import inspect
import itertools
import threading
from typing import Any

import pytest
import torch

from collectors.torch_hooks import handle_of, instrument, uninstrument
from collectors.torch_hooks.cuda import CudaStepTimer


def decode_loop(model: Any, prompt_len: int, steps: int, batch: int = 1) -> None:
    """A hand-written greedy loop, the way custom engines drive a model."""
    from transformers import DynamicCache

    cache = DynamicCache()
    ids = torch.arange(3, 3 + prompt_len).repeat(batch, 1)
    with torch.no_grad():
        out = model(input_ids=ids, cache=cache, past_key_values=cache, use_cache=True)
        for _ in range(steps):
            ids = out.logits[:, -1:].argmax(-1)
            out = model(input_ids=ids, cache=cache, past_key_values=cache, use_cache=True)


def strip_cache_kwarg(model: Any) -> None:
    """transformers 4.x forwards take past_key_values, 5.x cache: give each only its own."""
    params = inspect.signature(model.forward).parameters
    drop = "past_key_values" if "cache" in params else "cache"
    orig = model.forward

    def forward(*a: Any, **k: Any) -> Any:
        k.pop(drop, None)
        return orig(*a, **k)

    model.forward = forward


@pytest.fixture
def model(tiny: tuple[Any, Any]) -> Any:
    m = copy.deepcopy(tiny[0])
    strip_cache_kwarg(m)
    return m


@pytest.mark.parametrize("method", ["call", "wrap", "hooks"])
def test_steps_rows_classify_prefill_and_decode(model: Any, recorder: Any, read: Any, method: str) -> None:
    rec = recorder()
    h = instrument(model, rec, method=method)
    decode_loop(model, prompt_len=5, steps=4, batch=2)
    t = read(rec)
    steps = sorted(t.table("steps").to_pylist(), key=lambda r: r["step_id"])
    assert len(steps) == 5
    first, rest = steps[0], steps[1:]
    assert (first["prefill_tokens"], first["decode_tokens"], first["kv_tokens"]) == (10, 0, 10)
    assert [(r["prefill_tokens"], r["decode_tokens"], r["batch_size"]) for r in rest] == [(0, 2, 2)] * 4
    assert [r["kv_tokens"] // 2 for r in rest] == [6, 7, 8, 9]  # prompt + index
    assert all(r["end_ns"] > r["start_ns"] for r in steps)
    assert all(a["end_ns"] <= b["start_ns"] for a, b in itertools.pairwise(steps))
    assert h.last is not None and h.last.kv_len == 9


def test_one_token_prompt_is_prefill(model: Any, recorder: Any, read: Any) -> None:
    rec = recorder()
    instrument(model, rec)
    decode_loop(model, prompt_len=1, steps=2)
    steps = sorted(read(rec).table("steps").to_pylist(), key=lambda r: r["step_id"])
    assert [r["prefill_tokens"] for r in steps] == [1, 0, 0]
    assert [r["kv_tokens"] for r in steps] == [1, 2, 3]


def test_uninstrument_removes_everything(model: Any, recorder: Any, read: Any) -> None:
    sig = inspect.signature(model.forward)
    before = dict(model.__dict__)
    rec = recorder()
    h = instrument(model, rec)
    assert inspect.signature(model.forward) == sig  # transformers reads it
    assert instrument(model, rec) is h  # idempotent
    decode_loop(model, 2, 1)
    assert uninstrument(model) is True
    assert uninstrument(model) is False
    assert handle_of(model) is None
    assert set(model.__dict__) == set(before)
    decode_loop(model, 2, 1)  # untimed now
    assert read(rec).rows("steps") == 2


def test_call_method_keeps_torch_hooks_working_and_timed(model: Any, recorder: Any, read: Any) -> None:
    """The default method stands in for Module._call_impl: hooks registered before or after
    instrument() still run (through _call_impl), and those calls are still steps."""
    rec = recorder()
    h = instrument(model, rec)
    assert h.method == "call" and model._compiled_call_impl is not None
    seen: list[str] = []
    pre = model.register_forward_pre_hook(lambda m, a: seen.append("pre"))
    post = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: seen.append("global"))
    try:
        decode_loop(model, 2, 1)
    finally:
        pre.remove()
        post.remove()
    assert seen.count("pre") == 2 and seen.count("global") >= 2
    decode_loop(model, 2, 1)  # no hooks: the inline dispatch
    steps = sorted(read(rec).table("steps").to_pylist(), key=lambda r: r["step_id"])
    assert [r["kv_tokens"] for r in steps] == [2, 3, 2, 3]


def test_compiled_model_gets_the_forward_wrapper(model: Any, recorder: Any, read: Any) -> None:
    rec = recorder()
    model.compile()  # lazy: nothing is compiled until a call
    compiled = model._compiled_call_impl
    h = instrument(model, rec)
    assert h.method == "wrap" and model._compiled_call_impl is compiled
    uninstrument(model)
    assert model._compiled_call_impl is compiled


def test_pickled_instrumented_model_is_plain(tiny: tuple[Any, Any], recorder: Any, read: Any) -> None:
    import pickle

    model = copy.deepcopy(tiny[0])
    rec = recorder()
    instrument(model, rec)
    clone = pickle.loads(pickle.dumps(model))
    assert handle_of(clone) is None and clone._compiled_call_impl is None
    x = torch.tensor([[3, 4, 5]])
    torch.testing.assert_close(clone(input_ids=x).logits, model(input_ids=x).logits)
    assert read(rec).rows("steps") == 1


def test_hooks_method_removes_its_hooks(model: Any, recorder: Any) -> None:
    rec = recorder()
    with instrument(model, rec, method="hooks"):
        assert model._forward_pre_hooks and model._forward_hooks
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert handle_of(model) is None


def test_recording_switches_on_and_off_at_run_time(model: Any, recorder: Any, read: Any) -> None:
    rec = recorder()
    h = instrument(model, rec)
    rec.enabled = False
    decode_loop(model, 3, 2)
    with rec.request("off") as req:
        h.token(req, 0)
    rec.enabled = True
    decode_loop(model, 3, 1)
    with rec.request("on") as req:
        h.token(req, 0)
    t = read(rec)
    assert t.rows("steps") == 2
    assert t.table("tokens").column("request_id").to_pylist() == ["on"]


class Exploding(list):  # type: ignore[type-arg]
    def append(self, item: Any) -> None:
        raise RuntimeError("collector bug")


def test_a_failing_writer_never_reaches_the_model_caller(model: Any, recorder: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    rec = recorder()
    ref = model(input_ids=torch.tensor([[3, 4, 5]])).logits
    # fault injected into the steps sink: the list the timing function hands its rows to
    monkeypatch.setattr(rec.writer.sink("steps"), "tuple_feed", lambda convert: Exploding())
    h = instrument(model, rec)
    monkeypatch.undo()
    out = model(input_ids=torch.tensor([[3, 4, 5]])).logits  # general reading (no cache object)
    torch.testing.assert_close(out, ref)
    assert rec.errors == 1
    decode_loop(model, 3, 2)  # the inline reading of a DynamicCache
    assert rec.errors == 4
    uninstrument(h)

    from collectors.torch_hooks import _CAPTURING, _capture

    instrument(model, rec)  # a working feed; the fault is in the capture list now
    errors = rec.errors
    token = _capture.set(Exploding())
    _CAPTURING[0] += 1  # what capture() does besides setting the context variable
    try:
        decode_loop(model, 3, 2)  # the inline fast path (DynamicCache) fails after each forward
    finally:
        _CAPTURING[0] -= 1
        _capture.reset(token)
    assert rec.errors >= errors + 2


def test_model_errors_pass_through_unchanged(model: Any, recorder: Any) -> None:
    rec = recorder()
    instrument(model, rec)
    with pytest.raises((ValueError, TypeError)):
        model(input_ids=None)  # the model's own error, not ours
    assert rec.errors == 0


def test_deep_copy_of_an_instrumented_model_is_plain(model: Any, recorder: Any, read: Any) -> None:
    rec = recorder()
    instrument(model, rec)
    clone = copy.deepcopy(model)
    assert handle_of(clone) is None
    x = torch.tensor([[3, 4, 5]])
    torch.testing.assert_close(clone(input_ids=x).logits, model(input_ids=x).logits)
    assert read(rec).rows("steps") == 1  # only the original's call


def test_capture_collects_this_threads_steps_only(model: Any, recorder: Any) -> None:
    rec = recorder()
    h = instrument(model, rec)
    other = threading.Thread(target=decode_loop, args=(model, 2, 3))
    with h.capture() as raw:
        decode_loop(model, 4, 2)
        other.start()
        other.join()
    steps = h.steps(raw)
    assert [(s.prefill, s.q_len, s.kv_len) for s in steps] == [(True, 4, 4), (False, 1, 5), (False, 1, 6)]
    assert h.last is not None


def test_opaque_cache_falls_back_to_counting_tokens(recorder: Any, read: Any) -> None:
    class Engine(torch.nn.Module):
        """A gpt-fast-like module that keeps its cache inside: the wrapper only sees input ids."""

        def forward(self, input_ids: torch.Tensor, cache: Any = None) -> torch.Tensor:
            return input_ids

    m, box = Engine(), object()
    rec = recorder()
    h = instrument(m, rec)
    for n in (6, 1, 1):
        m(torch.zeros(1, n), cache=box)
    h.new_sequence()
    for n in (1, 1):
        m(torch.zeros(1, n), cache=box)
    kv = [r["kv_tokens"] for r in sorted(read(rec).table("steps").to_pylist(), key=lambda r: r["step_id"])]
    assert kv == [6, 7, 8, 1, 2]


def test_token_helper_ties_rows_to_the_last_step(model: Any, recorder: Any, read: Any) -> None:
    rec = recorder()
    h = instrument(model, rec)
    with rec.request("r1", prompt_tokens=3) as req:
        model(input_ids=torch.tensor([[3, 4, 5]]))
        h.token(req, 0)
    t = read(rec)
    tok, step = t.table("tokens").to_pylist()[0], t.table("steps").to_pylist()[0]
    assert tok["step_id"] == step["step_id"]
    assert (tok["step_start_ns"], tok["step_end_ns"], tok["kv_len"]) == (step["start_ns"], step["end_ns"], 3)


def test_token_rows_of_the_last_step_are_the_rows_the_request_writes(model: Any, recorder: Any, read: Any) -> None:
    """h.token(req, i) hands the flusher a tuple (the common token); given a kv_len it writes
    through the request's own path instead: both give the same row, the request id still there
    after the request finished."""
    from transformers import DynamicCache

    rec = recorder()
    h = instrument(model, rec)
    cache = DynamicCache()
    with torch.no_grad(), rec.request("fed") as fed, rec.request("packed") as packed:
        x = torch.tensor([[3, 4, 5]])
        for i in range(4):
            x = model(input_ids=x, cache=cache, past_key_values=cache).logits[:, -1:].argmax(-1)
            assert h.last is not None
            h.token(fed, i)
            h.token(packed, i, kv_len=h.last.kv_len)
    rows = read(rec).table("tokens").to_pylist()
    by = {rid: sorted((r for r in rows if r["request_id"] == rid), key=lambda r: r["index"])
          for rid in ("fed", "packed")}
    assert len(by["fed"]) == len(by["packed"]) == 4 and len(rows) == 8

    def same(r: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(v for k, v in r.items() if k not in ("request_id", "emit_ns"))

    assert [same(r) for r in by["fed"]] == [same(r) for r in by["packed"]]
    assert [r["kv_len"] for r in by["fed"]] == [3, 4, 5, 6]
    assert all(r["step_end_ns"] <= r["emit_ns"] for r in by["fed"])  # emitted after its step ended
    assert all(r["client_recv_ns"] is None for r in rows)


def test_token_rows_beyond_the_cap_are_dropped_and_counted(model: Any, recorder: Any, read: Any) -> None:
    rec = recorder(max_pending_rows=3, flush_interval_s=3600, flush_rows=1 << 20)
    h = instrument(model, rec)
    with torch.no_grad(), rec.request("r") as req:
        for i in range(5):
            model(input_ids=torch.tensor([[3, 4, 5]]))
            h.token(req, i)
    t = read(rec)
    assert t.rows("tokens") == 3 and t.meta["dropped_rows"]["tokens"] == 2
    assert rec.errors == 0


def test_a_sliding_window_layer_is_read_by_its_own_length(recorder: Any, read: Any) -> None:
    """A sliding window's keys hold the window, not the sequence: its length is its
    get_seq_length(), not the keys' sequence axis that a plain DynamicLayer is read by."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    class Decoder(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, cache: Any = None) -> torch.Tensor:
            n = input_ids.shape[1]
            for layer in range(len(cache.layers)):
                cache.update(torch.zeros(1, 2, n, 4), torch.zeros(1, 2, n, 4), layer)
            return input_ids

    rec = recorder()
    m = Decoder()
    instrument(m, rec)
    for layers in ([DynamicSlidingWindowLayer(sliding_window=4)], [DynamicLayer()]):
        cache = DynamicCache()
        cache.layers = layers  # type: ignore[assignment]
        for n in (6, 1, 1, 1):
            m(torch.zeros(1, n, dtype=torch.long), cache=cache)
    kv = [r["kv_tokens"] for r in sorted(read(rec).table("steps").to_pylist(), key=lambda r: r["step_id"])]
    assert kv == [6, 7, 8, 9] * 2
    assert rec.errors == 0


# -- CUDA event mapping, with a scripted event double (no GPU here) --------------------------------------
class Clock:
    """Device time in ns; events complete when the test says the device got there."""

    def __init__(self) -> None:
        self.now = 0
        self.done_until = 0


class FakeEvent:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.t: int | None = None

    def record(self, stream: Any = None) -> None:
        self.clock.now += 1_000
        self.t = self.clock.now

    def query(self) -> bool:
        return self.t is not None and self.t <= self.clock.done_until

    def synchronize(self) -> None:
        assert self.t is not None
        self.clock.done_until = max(self.clock.done_until, self.t)

    def elapsed_time(self, other: FakeEvent) -> float:
        assert self.query() and other.query(), "elapsed_time on an incomplete event"
        assert self.t is not None and other.t is not None
        return (other.t - self.t) / 1e6


def test_cuda_steps_resolve_off_the_hot_path(recorder: Any) -> None:
    rec = recorder()
    clock = Clock()
    written: list[list[Any]] = []
    timer = CudaStepTimer(written.append, rec, event_factory=lambda: FakeEvent(clock), reanchor_s=3600)
    anchor_ns = timer._anchor_ns
    raws = []
    for i in range(3):
        ev = timer.start()
        raw = [i, 0, 0, 1, 1, 10 + i, False, ev, None, None]
        timer.finish(raw)
        raws.append(raw)
    assert written == [] and all(r[8] is None for r in raws)  # nothing waited for on the hot path
    clock.done_until = clock.now  # the device catches up
    timer.resolve(raws)
    assert [r[0] for r in written] == [0, 1, 2]
    # anchor event at t=1000; step i: start at 2000+2000i, end 1000 later
    assert [(r[8] - anchor_ns, r[9] - anchor_ns) for r in raws] == [(1000, 2000), (3000, 4000), (5000, 6000)]
    timer.close()


def test_cuda_timed_wrapper_writes_steps_once_events_complete(recorder: Any, read: Any) -> None:
    from collectors.torch_hooks import HookHandle, _install_wrapper

    class Mod(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return input_ids

    rec, clock, m = recorder(), Clock(), Mod()
    h = HookHandle(m, rec, cuda=False, method="wrap")
    h._timer = CudaStepTimer(h._write_raw, rec, event_factory=lambda: FakeEvent(clock), poll_s=0.001)
    h.cuda = True
    _install_wrapper(h, m)
    with h.capture() as raw:
        m(torch.zeros(1, 4))
        m(torch.zeros(1, 1))
    assert all(r[8] is None for r in raw)  # device times unknown until the events complete
    clock.done_until = clock.now
    steps = h.steps(raw)
    assert [s.kv_len for s in steps] == [4, 5]
    assert all(s.start_ns is not None and s.end_ns is not None and s.end_ns > s.start_ns for s in steps)
    t = read(rec)
    assert sorted(r["kv_tokens"] for r in t.table("steps").to_pylist()) == [4, 5]


@pytest.mark.gpu
def test_cuda_hot_path_never_synchronizes(recorder: Any, read: Any) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU with a CUDA build of torch")
    lin = torch.nn.Linear(64, 64).cuda()
    rec = recorder()
    instrument(lin, rec)
    x = torch.randn(8, 64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(50):
            x = lin(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    t = read(rec)
    steps = t.table("steps").to_pylist()
    assert len(steps) == 50 and all(r["end_ns"] >= r["start_ns"] for r in steps)
