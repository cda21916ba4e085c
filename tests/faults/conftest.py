"""Fixtures of the fault tests: the demo tokenizer cached in a session tmp dir, a tiny demo Llama."""

from __future__ import annotations

from typing import Any

import pytest

from tracetool import notices

#: A demo Llama small enough that a generate takes milliseconds.
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
        "head_dim": 32, "intermediate_size": 128}


@pytest.fixture(autouse=True)
def _fresh_notices() -> None:
    """Each test sees its own first notices (they are said once per process)."""
    notices.reset()


@pytest.fixture(scope="session")
def tiny() -> tuple[Any, Any]:
    """(model, tokenizer): the demo Llama at a tiny shape, seed 0."""
    import torch

    torch.set_num_threads(1)
    from collectors.demo import load_demo_model

    return load_demo_model(seed=0, **TINY)
