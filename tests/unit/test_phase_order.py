"""The server phases are spelled once (tracetool.schema.PHASES), in serving order."""

from __future__ import annotations

from collectors.asgi import TIMING_PHASES
from tracetool.schema import COMPONENTS, PHASES, PHASES_BEFORE_FIRST_TOKEN, PHASES_FROM_FIRST_TOKEN


def test_phases_are_the_server_components_in_serving_order() -> None:
    assert set(PHASES) == set(COMPONENTS) - {"client_queue", "network", "frontend", "other"}
    assert PHASES_BEFORE_FIRST_TOKEN[-1] == "prefill" and PHASES_FROM_FIRST_TOKEN[0] == "decode"
    assert PHASES_BEFORE_FIRST_TOKEN + PHASES_FROM_FIRST_TOKEN == PHASES
    assert PHASES.index("tokenize") < PHASES.index("queue"), "a request is tokenized before it waits for the engine"
    assert TIMING_PHASES is PHASES
