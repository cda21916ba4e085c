"""Two orders, each spelled once: the server phases in serving order (tracetool.schema.PHASES) and the
attribution's components in the order every output lists them (tracetool.schema.COMPONENTS). They
differ on purpose (COMPONENTS lists queue before tokenize and preprocess); these tests pin exactly how,
and that the SQL and the docs list the components in the schema's order."""

from __future__ import annotations

import re
from pathlib import Path

from collectors.asgi import TIMING_PHASES
from tracetool.schema import COMPONENTS, PHASES, PHASES_BEFORE_FIRST_TOKEN, PHASES_FROM_FIRST_TOKEN

REPO = Path(__file__).resolve().parents[2]


def test_phases_are_in_serving_order() -> None:
    assert PHASES_BEFORE_FIRST_TOKEN[-1] == "prefill" and PHASES_FROM_FIRST_TOKEN[0] == "decode"
    assert PHASES_BEFORE_FIRST_TOKEN + PHASES_FROM_FIRST_TOKEN == PHASES
    assert PHASES.index("tokenize") < PHASES.index("queue"), "a request is tokenized before it waits for the engine"
    assert TIMING_PHASES is PHASES


def test_components_are_the_outside_then_the_phases_in_report_order_then_other() -> None:
    """The report's order of the server phases is PHASES with the phases before prefill reversed
    (queue, tokenize, preprocess), prefill and what follows it as served."""
    server = tuple(c for c in COMPONENTS if c in PHASES)
    assert tuple(COMPONENTS) == ("client_queue", "network", "frontend", *server, "other")
    before_prefill = PHASES_BEFORE_FIRST_TOKEN[:-1]
    assert server == (*reversed(before_prefill), "prefill", *PHASES_FROM_FIRST_TOKEN)
    assert server[0] == "queue"


def test_the_docs_list_the_components_in_the_schemas_order() -> None:
    row = next(line for line in (REPO / "docs" / "analysis-json.md").read_text().splitlines()
               if line.startswith("| `components` |"))
    names = [n for n in re.findall(r"`(\w+)`", row.split("in order:", 1)[1]) if n in COMPONENTS]
    assert tuple(dict.fromkeys(names)) == COMPONENTS
