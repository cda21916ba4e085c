"""The C timing slot (collectors/torch_hooks/_cstep.c) against the Python one: built where it can
be, the same steps for the same calls, the inline path taken where the Python slot takes it, rows
capped and counted, and no reference from the trace back to the model."""

from __future__ import annotations

import copy
import gc
import shlex
import shutil
import sysconfig
import threading
import weakref
from typing import Any

import pytest
import torch

import collectors.torch_hooks as th
from collectors.hf import instrument_hf, unwrap_generate, unwrap_tokenizer
from collectors.torch_hooks import HookHandle, instrument, uninstrument

PROMPTS = ["The keeper wrote the time", "Bread"]


def test_the_c_step_slot_is_built_where_a_compiler_is() -> None:
    import os

    if os.environ.get("TRACETOOL_PURE_PYTHON"):
        pytest.skip("TRACETOOL_PURE_PYTHON asks for the Python slot")
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) here: the install skipped the optional C slot")
    assert th._cstep is not None, (
        f"{cc} is here but collectors.torch_hooks._cstep was not built: pip install -e . builds it")


@pytest.fixture
def cslot() -> Any:
    if th._cstep is None:
        pytest.skip("the C step slot is not built here (no C compiler at install, or TRACETOOL_PURE_PYTHON)")
    return th._cstep


def _generate(model: Any, tok: Any) -> list[list[int]]:
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    return [list(map(int, r)) for r in out]


def _steps(read: Any, rec: Any) -> list[tuple[int, int, int, int]]:
    rows = sorted(read(rec).table("steps").to_pylist(), key=lambda r: r["step_id"])
    return [(r["batch_size"], r["prefill_tokens"], r["decode_tokens"], r["kv_tokens"]) for r in rows]


def test_c_and_python_slots_record_the_same_steps(cslot: Any, tiny: tuple[Any, Any], recorder: Any, read: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    got = {}
    for impl in ("c", "python"):
        model, tok = copy.deepcopy(tiny[0]), copy.deepcopy(tiny[1])
        if impl == "python":
            monkeypatch.setattr(th, "_cstep", None)
        rec = recorder(impl)
        instrument_hf(model, tok, rec)
        assert th.handle_of(model) is not None
        assert th.handle_of(model).accelerated is (impl == "c")  # type: ignore[union-attr]
        out = _generate(model, tok)
        unwrap_generate(model)
        unwrap_tokenizer(tok)
        uninstrument(model)
        got[impl] = (out, _steps(read, rec), read(rec).table("tokens").num_rows, rec.errors)
        monkeypatch.undo()
    assert got["c"] == got["python"]
    steps = got["c"][1]
    assert len(steps) == 5 and steps[0][0] == 2 and steps[0][1] > 0 and all(s[2] == 2 for s in steps[1:])


def _cache_44() -> Any:
    """What transformers 4.4x's DynamicCache looks like to the slots: a class named DynamicCache
    with a ``key_cache`` list of tensors."""
    cls = type("DynamicCache", (), {})
    cache = cls()
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


def _never_general(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the general path fail: a step that takes it is counted as an error."""
    def broken(*a: Any, **k: Any) -> Any:
        raise AssertionError("the general path was taken")

    monkeypatch.setattr(HookHandle, "_pre", broken)


@pytest.mark.usefixtures("step_slot")
def test_a_4x_dynamic_cache_is_read_inline(recorder: Any, read: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = recorder()
    m = _Model44()
    instrument(m, rec)
    _never_general(monkeypatch)
    cache = _cache_44()
    m(torch.zeros(1, 4, dtype=torch.long), past_key_values=cache)
    for _ in range(3):
        m(torch.zeros(1, 1, dtype=torch.long), past_key_values=cache)
    assert rec.errors == 0
    assert _steps(read, rec) == [(1, 4, 0, 4), (1, 0, 1, 5), (1, 0, 1, 6), (1, 0, 1, 7)]


@pytest.mark.usefixtures("step_slot")
def test_a_dynamic_cache_is_read_inline_and_odd_calls_take_the_general_path(
        tiny: tuple[Any, Any], recorder: Any, read: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import DynamicCache

    model = copy.deepcopy(tiny[0])
    rec = recorder()
    h = instrument(model, rec)
    cache = DynamicCache()
    with torch.no_grad():
        model(torch.arange(3, 9).unsqueeze(0), past_key_values=cache, cache=cache, use_cache=True)  # positional
        _never_general(monkeypatch)
        for i in range(2):
            model(input_ids=torch.tensor([[5]]), past_key_values=cache, cache=cache, use_cache=True)
            assert h.last is not None and (h.last.q_len, h.last.kv_len, h.last.prefill) == (1, 7 + i, False)
        assert rec.errors == 0
        monkeypatch.undo()
        model(input_ids=torch.tensor([[3, 4]]))  # no cache object: the general path
        assert h.last is not None and (h.last.q_len, h.last.kv_len, h.last.prefill) == (2, 2, True)
    assert _steps(read, rec) == [(1, 6, 0, 6), (1, 0, 1, 7), (1, 0, 1, 8), (1, 2, 0, 2)]


class DynamicLayer:
    """transformers 4.56's DynamicLayer as the slots see it: ``keys`` None until the first
    update, and no ``is_initialized`` (4.57 added it)."""

    def __init__(self) -> None:
        self.keys: Any = None


class _Model456(torch.nn.Module):
    """A decoder taking ``past_key_values`` with ``layers``, the 4.56 way: appends q_len positions to layer 0."""

    def forward(self, input_ids: torch.Tensor, past_key_values: Any = None, use_cache: bool = True) -> Any:
        layer = past_key_values.layers[0]
        new = torch.zeros(input_ids.shape[0], 2, input_ids.shape[1], 4)
        layer.keys = new if layer.keys is None else torch.cat([layer.keys, new], dim=-2)
        return input_ids


@pytest.mark.usefixtures("step_slot")
def test_a_456_dynamic_layer_without_is_initialized_is_read_inline(
        recorder: Any, read: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = recorder()
    m = _Model456()
    h = instrument(m, rec)
    _never_general(monkeypatch)
    cache = type("DynamicCache", (), {})()
    cache.layers = [DynamicLayer()]
    m(torch.zeros(1, 5, dtype=torch.long), past_key_values=cache)
    for i in range(2):
        m(torch.zeros(1, 1, dtype=torch.long), past_key_values=cache)
        assert h.last is not None and (h.last.q_len, h.last.kv_len, h.last.prefill) == (1, 6 + i, False)
    assert rec.errors == 0
    assert _steps(read, rec) == [(1, 5, 0, 5), (1, 0, 1, 6), (1, 0, 1, 7)]


@pytest.mark.usefixtures("step_slot")
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


@pytest.mark.usefixtures("step_slot")
def test_torch_jit_trace_sees_the_module_scopes_it_sees_without_the_collector(
        recorder: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The slot calls forward directly, skipping _call_impl, only where _call_impl would do the
    same: under torch.jit.trace of a module, which records each module's scope through
    _call_impl's _slow_forward, the instrumented module keeps its scope; under a traced function
    (no scopes recorded) the step is still read inline and timed."""
    from transformers import DynamicCache

    cache = DynamicCache()  # one initialized layer of 5 positions: the inline path reads it
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
    _never_general(monkeypatch)
    with torch.no_grad():
        torch.jit.trace(lambda t: model.inner(t, cache=cache), x)
    assert rec.errors == 0
    assert h.last is not None and h.last.kv_len == 9


@pytest.mark.usefixtures("step_slot")
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


def test_steps_from_several_threads_all_arrive_once(cslot: Any, tiny: tuple[Any, Any], recorder: Any,
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


def test_step_rows_buffer(cslot: Any) -> None:
    rows = cslot.StepRows(2)
    assert (len(rows), rows.max_rows, rows.take()) == (0, 2, b"")
    assert rows.push((1, 2, 3, 4, 5, 6, 1)) and rows.push([7, 8, 9, 10, 11, 12, 0])
    assert not rows.push((1, 2, 3, 4, 5, 6, 1))  # full: the caller counts it
    assert len(rows) == 2
    import numpy as np

    assert np.frombuffer(rows.take(), dtype=np.int64).tolist() == [1, 2, 3, 4, 5, 6, 1, 7, 8, 9, 10, 11, 12, 0]
    assert len(rows) == 0
    with pytest.raises(ValueError):
        rows.push((1, 2, 3))
    with pytest.raises(TypeError):
        rows.push((1, 2, 3, 4, 5, 6, "x"))
    with pytest.raises(ValueError):
        cslot.StepRows(-1)
