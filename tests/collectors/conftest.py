"""Fixtures for the collector tests: a tiny demo Llama, recorders in tmp dirs, trace reading."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collectors import Recorder
from tracetool.reader import Trace, open_trace

#: A demo Llama small enough that a test generate takes milliseconds.
TINY = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
        "head_dim": 32, "intermediate_size": 128}


@pytest.fixture(scope="session")
def tiny_shape() -> dict[str, int]:
    return dict(TINY)


@pytest.fixture(scope="session")
def tiny() -> tuple[Any, Any]:
    """(model, tokenizer): the demo Llama at a tiny shape, seed 0."""
    from collectors.demo import load_demo_model

    return load_demo_model(seed=0, **TINY)


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[Callable[..., Recorder]]:
    """Make started recorders in tmp dirs; whatever a test leaves open is closed after it."""
    made: list[Recorder] = []

    def make(name: str = "trace", **kw: Any) -> Recorder:
        rec = Recorder(tmp_path / name, **kw).start()
        made.append(rec)
        return rec

    yield make
    for rec in made:
        rec.close()


@pytest.fixture
def read() -> Callable[[Recorder], Trace]:
    """Close a recorder and read its trace back (strictly, as ``tracetool validate`` does)."""

    def run(rec: Recorder) -> Trace:
        rec.close()
        return open_trace(rec.path, strict=True)

    return run
