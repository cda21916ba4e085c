"""The timing function on real and look-alike caches: where instrument() puts it (the dispatch),
the private torch names it relies on, the same steps read from every cache API, rows capped and
counted, torch.jit.trace unchanged, steps from several threads, and no reference from the trace
back to the model."""

from __future__ import annotations

import copy
import gc
import threading
import weakref
from typing import Any

import pytest
import torch

import collectors.torch_hooks as th
from collectors.torch_hooks import instrument, uninstrument


def test_torch_still_has_the_call_slot_the_default_method_takes() -> None:
    """Module.__call__ runs ``_compiled_call_impl`` when set, else ``_call_impl``: private torch
    names. Where an installed torch moved them, instrument() would quietly fall back to the
    forward wrapper; this says so loudly instead."""
    m = torch.nn.Linear(2, 2)
    assert getattr(m, th._SLOT, False) is None, (
        f"torch {torch.__version__}: torch.nn.Module.{th._SLOT} moved; collectors/torch_hooks "
        "_take_call_slot() must follow it")
    assert callable(getattr(m, th._CALL_IMPL, None)), (
        f"torch {torch.__version__}: torch.nn.Module.{th._CALL_IMPL} moved; collectors/torch_hooks "
        "_take_call_slot() must follow it")
    calls: list[str] = []
    m.__dict__[th._SLOT] = lambda *a, **k: calls.append("slot")
    m(torch.zeros(1, 2))
    assert calls == ["slot"], f"torch {torch.__version__}: Module.__call__ no longer runs {th._SLOT}"


class _Plain(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return input_ids


class _NotAModule:
    """A callable that is not a torch Module (a gpt-fast-style engine object, say)."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return input_ids

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.forward(input_ids)


@pytest.mark.parametrize(("kind", "asked", "got"), [
    ("module", "call", "call"), ("module", "wrap", "wrap"), ("module", "hooks", "hooks"),
    ("compiled", "call", "wrap"), ("not a module", "call", "wrap")])
def test_dispatch_puts_the_one_timing_function_where_the_model_takes_it(
        kind: str, asked: str, got: str, recorder: Any, read: Any) -> None:
    """Where each method puts the timing, and that each place times the call: the call slot
    (the default), the instance forward (a compiled module, or anything that is not a torch
    Module) or torch's forward hooks."""
    m: Any = _NotAModule() if kind == "not a module" else _Plain()
    if kind == "compiled":
        m.compile()  # lazy: nothing is compiled until a call
    before = dict(vars(m))
    rec = recorder()
    h = instrument(m, rec, method=asked)
    assert h.method == got
    placed = {"call": m.__dict__.get(th._SLOT) is not before.get(th._SLOT),
              "wrap": "forward" in m.__dict__,
              "hooks": bool(getattr(m, "_forward_pre_hooks", None))}
    assert [k for k, v in placed.items() if v] == [got]
    if kind != "compiled":  # a compiled call would run inductor: not this test's business
        x = torch.zeros(1, 3)
        assert torch.equal(m(x), x)
        steps = read(rec).table("steps").to_pylist()
        assert steps and steps[0]["prefill_tokens"] == 3
    uninstrument(m)
    assert vars(m).keys() == before.keys() and vars(m).get(th._SLOT) is before.get(th._SLOT)


def _from_the_cache_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make a step whose kv_len does not come from CPU metadata fail (counted as a collector
    error): otherwise the tokens-fed counter would give the same kv_len in a plain loop."""
    real = th.past_len

    def strict(*a: Any, **k: Any) -> Any:
        n = real(*a, **k)
        if n is None:
            raise AssertionError("kv_len was not read from the cache")
        return n

    monkeypatch.setattr(th, "past_len", strict)


def _steps(read: Any, rec: Any) -> list[tuple[int, int, int, int]]:
    rows = sorted(read(rec).table("steps").to_pylist(), key=lambda r: r["step_id"])
    return [(r["batch_size"], r["prefill_tokens"], r["decode_tokens"], r["kv_tokens"]) for r in rows]


def _cache_44() -> Any:
    """What transformers 4.4x's DynamicCache looks like to the collector: a class named
    DynamicCache with a ``key_cache`` list of tensors, and its public ``get_seq_length``."""

    def get_seq_length(self: Any, layer_idx: int = 0) -> int:
        kc = self.key_cache
        return 0 if len(kc) <= layer_idx or kc[layer_idx].numel() == 0 else int(kc[layer_idx].shape[-2])

    cache = type("DynamicCache", (), {"get_seq_length": get_seq_length})()
    cache.key_cache = []
    return cache


class _Model44(torch.nn.Module):
    """A decoder taking ``past_key_values`` the 4.4x way: appends q_len positions to layer 0."""

    def forward(self, input_ids: torch.Tensor, past_key_values: Any = None, use_cache: bool = True) -> Any:
        kc = past_key_values.key_cache
        new = torch.zeros(input_ids.shape[0], 2, input_ids.shape[1], 4)
        if not kc:
            kc.append(new)
        else:
            kc[0] = torch.cat([kc[0], new], dim=-2)
        return input_ids


def test_a_4x_dynamic_cache_is_read(recorder: Any, read: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = recorder()
    m = _Model44()
    instrument(m, rec)
    _from_the_cache_only(monkeypatch)
    cache = _cache_44()
    m(torch.zeros(1, 4, dtype=torch.long), past_key_values=cache)
    for _ in range(3):
        m(torch.zeros(1, 1, dtype=torch.long), past_key_values=cache)
    assert rec.errors == 0
    assert _steps(read, rec) == [(1, 4, 0, 4), (1, 0, 1, 5), (1, 0, 1, 6), (1, 0, 1, 7)]


def test_a_dynamic_cache_is_read_and_a_call_without_one_is_still_a_step(
        tiny: tuple[Any, Any], recorder: Any, read: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import DynamicCache

    model = copy.deepcopy(tiny[0])
    rec = recorder()
    h = instrument(model, rec)
    cache = DynamicCache()
    with torch.no_grad():
        model(torch.arange(3, 9).unsqueeze(0), past_key_values=cache, cache=cache, use_cache=True)  # positional
        _from_the_cache_only(monkeypatch)
        for i in range(2):
            model(input_ids=torch.tensor([[5]]), past_key_values=cache, cache=cache, use_cache=True)
            assert h.last is not None and (h.last.q_len, h.last.kv_len, h.last.prefill) == (1, 7 + i, False)
        assert rec.errors == 0
        monkeypatch.undo()
        model(input_ids=torch.tensor([[3, 4]]))  # no cache object: q_len, a fresh sequence
        assert h.last is not None and (h.last.q_len, h.last.kv_len, h.last.prefill) == (2, 2, True)
    assert _steps(read, rec) == [(1, 6, 0, 6), (1, 0, 1, 7), (1, 0, 1, 8), (1, 2, 0, 2)]


class DynamicLayer:
    """transformers 4.56's DynamicLayer as the collector sees it: ``keys`` None until the first
    update, no ``is_initialized`` (4.57 added it), and its public ``get_seq_length``."""

    def __init__(self) -> None:
        self.keys: Any = None

    def get_seq_length(self) -> int:
        return 0 if self.keys is None or self.keys.numel() == 0 else int(self.keys.shape[-2])


class _Model456(torch.nn.Module):
    """A decoder taking ``past_key_values`` with ``layers``, the 4.56 way: appends q_len positions to layer 0."""

    def forward(self, input_ids: torch.Tensor, past_key_values: Any = None, use_cache: bool = True) -> Any:
        layer = past_key_values.layers[0]
        new = torch.zeros(input_ids.shape[0], 2, input_ids.shape[1], 4)
        layer.keys = new if layer.keys is None else torch.cat([layer.keys, new], dim=-2)
        return input_ids


def test_a_456_dynamic_layer_without_is_initialized_is_read(
        recorder: Any, read: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = recorder()
    m = _Model456()
    h = instrument(m, rec)
    _from_the_cache_only(monkeypatch)
    cache = type("DynamicCache", (), {})()
    cache.layers = [DynamicLayer()]
    m(torch.zeros(1, 5, dtype=torch.long), past_key_values=cache)
    for i in range(2):
        m(torch.zeros(1, 1, dtype=torch.long), past_key_values=cache)
        assert h.last is not None and (h.last.q_len, h.last.kv_len, h.last.prefill) == (1, 6 + i, False)
    assert rec.errors == 0
    assert _steps(read, rec) == [(1, 5, 0, 5), (1, 0, 1, 6), (1, 0, 1, 7)]


def test_rows_beyond_the_cap_are_dropped_and_counted(tiny: tuple[Any, Any], recorder: Any, read: Any) -> None:
    from transformers import DynamicCache

    model = copy.deepcopy(tiny[0])
    rec = recorder(max_pending_rows=3, flush_interval_s=3600, flush_rows=1 << 20)
    instrument(model, rec)
    cache = DynamicCache()
    with torch.no_grad():
        for n in (4, 1, 1, 1, 1, 1, 1):
            model(input_ids=torch.ones(1, n, dtype=torch.long), cache=cache, past_key_values=cache)
    t = read(rec)
    assert t.rows("steps") == 3
    assert t.meta["dropped_rows"]["steps"] == 4
    assert rec.errors == 0


class _Inner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, input_ids: torch.Tensor, cache: Any = None) -> torch.Tensor:
        return self.proj(input_ids.float())


class _Outer(torch.nn.Module):
    def __init__(self, cache: Any) -> None:
        super().__init__()
        self.inner = _Inner()
        self.cache = cache

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x, cache=self.cache)


def test_torch_jit_trace_sees_the_module_scopes_it_sees_without_the_collector(
        recorder: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The slot calls _call_impl, so under torch.jit.trace of a module, which records each
    module's scope through _call_impl's _slow_forward, the instrumented module keeps its scope;
    under a traced function (no scopes recorded) the step is still read from the cache and timed."""
    from transformers import DynamicCache

    cache = DynamicCache()  # one initialized layer of 5 positions
    cache.update(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4), 0)
    x = torch.ones(1, 4, dtype=torch.long)

    def scopes(m: Any) -> list[str]:
        with torch.no_grad():
            traced = torch.jit.trace(m, x)
        return sorted({n.scopeName() for n in traced.inlined_graph.nodes()})

    plain = _Outer(cache).requires_grad_(False)  # a traced function takes parameters as constants
    model = copy.deepcopy(plain)
    rec = recorder()
    h = instrument(model.inner, rec)
    want = scopes(plain)
    assert "__module.inner" in want
    assert scopes(model) == want
    assert h.last is not None and (h.last.batch, h.last.q_len, h.last.kv_len) == (1, 4, 9)
    _from_the_cache_only(monkeypatch)
    with torch.no_grad():
        torch.jit.trace(lambda t: model.inner(t, cache=cache), x)
    assert rec.errors == 0
    assert h.last is not None and h.last.kv_len == 9


def test_the_trace_keeps_no_uninstrumented_model_alive(tiny: tuple[Any, Any], recorder: Any, read: Any) -> None:
    model = copy.deepcopy(tiny[0])
    rec = recorder()
    h = instrument(model, rec)
    with torch.no_grad():
        model(input_ids=torch.tensor([[3, 4, 5]]))
    alive = weakref.ref(model)
    uninstrument(model)
    del model, h
    gc.collect()
    assert alive() is None, "the recorder still holds the model it timed"
    assert read(rec).rows("steps") == 1  # its row still reached the trace


def test_steps_from_several_threads_all_arrive_once(tiny: tuple[Any, Any], recorder: Any,
                                                    read: Any) -> None:
    from transformers import DynamicCache

    model = copy.deepcopy(tiny[0])
    rec = recorder(flush_rows=7, flush_interval_s=0.001)  # the writer drains while the threads write
    instrument(model, rec)

    def loop() -> None:
        cache = DynamicCache()
        with torch.no_grad():
            for n in (3,) + (1,) * 49:
                model(input_ids=torch.ones(1, n, dtype=torch.long), cache=cache, past_key_values=cache)

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    steps = read(rec).table("steps").to_pylist()
    assert len(steps) == 200 and len({s["step_id"] for s in steps}) == 200
    assert sorted(s["kv_tokens"] for s in steps) == sorted(list(range(3, 53)) * 4)
