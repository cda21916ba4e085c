"""Patch transformers at import time, the way ``opentelemetry-instrument`` patches libraries.

Used by ``tracetool record``: ``GenerationMixin.generate`` and the tokenizer
base class are patched right after their modules execute, so an unmodified
script is traced. Nothing here imports transformers.
"""

from __future__ import annotations

import functools
import importlib.abc
import sys
from collections.abc import Callable
from typing import Any

from collectors.hf.generate import AUTO, _traced
from collectors.hf.tokenizer import _patch_tokenizer_class
from tracetool.recorder import Recorder


def _patch_generation(module: Any) -> None:
    mixin = module.GenerationMixin
    orig = mixin.__dict__["generate"]
    if getattr(orig, "_tracetool", False):
        return

    @functools.wraps(orig)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec = AUTO["recorder"]
        if rec is None:
            return orig(self, *args, **kwargs)
        return _traced(functools.partial(orig, self), self, rec, args, kwargs, None)

    generate._tracetool = True  # type: ignore[attr-defined]
    mixin.generate = generate
    AUTO["undo"].append(lambda: setattr(mixin, "generate", orig))


def _patch_tokenizers(module: Any) -> None:
    AUTO["undo"] += _patch_tokenizer_class(module.PreTrainedTokenizerBase)


_AUTOPATCH_TARGETS: dict[str, Callable[[Any], None]] = {
    "transformers.generation.utils": _patch_generation,
    "transformers.tokenization_utils_base": _patch_tokenizers,
}


class _PostImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after a module executes (how opentelemetry-instrument patches libraries)."""

    def __init__(self, targets: dict[str, Callable[[Any], None]], on_error: Callable[[str, Exception], None]) -> None:
        self.targets = targets
        self.on_error = on_error
        self.busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.targets or fullname in self.busy:
            return None
        self.busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self.busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, callback, on_error = spec.loader, self.targets[fullname], self.on_error

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                try:
                    callback(module)
                except Exception as e:  # a patch that fails must not break the import
                    on_error(fullname, e)

        spec.loader = _Loader()
        return spec


def autopatch(recorder: Recorder) -> None:
    """Trace every ``generate`` and tokenizer call of the process into ``recorder``, including
    in modules imported later (``transformers`` is patched when it loads, never imported here)."""
    AUTO["recorder"] = recorder
    pending = {}
    for name, fn in _AUTOPATCH_TARGETS.items():
        mod = sys.modules.get(name)
        if mod is not None:
            recorder.guard(fn, mod, where=f"autopatch {name}")
        else:
            pending[name] = fn
    if pending:
        finder = _PostImport(pending, lambda name, e: recorder.error(f"autopatch {name}", e))
        sys.meta_path.insert(0, finder)
        AUTO["undo"].append(lambda: sys.meta_path.remove(finder) if finder in sys.meta_path else None)
    recorder.on_close(unpatch)


def unpatch() -> None:
    """Undo :func:`autopatch` (the recorder is closing)."""
    AUTO["recorder"] = None
    undo, AUTO["undo"] = AUTO["undo"], []
    for fn in reversed(undo):
        try:
            fn()
        except Exception:
            pass
