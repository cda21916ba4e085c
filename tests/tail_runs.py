"""The tail scenarios (tests/analyzers/tail_scenarios.py) written once and analysed once, for the
tests of every surface that explains the tail (analyze's text, the TUI, report's gate, diff).

Each surface is compared with what ``tracetool analyze --json`` says of the same trace: its ``tail``
object and its tail findings. Writing a scenario and analysing it cost a second or two each, so both
happen on first use and are kept for the session.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

from tests.analyzers.tail_scenarios import build
from tracetool.cli import main as cli_main

#: The metric names in the tail's sentences and findings, as the ``tail`` object keys them.
METRIC_KEYS = {"TTFT": "ttft", "e2e": "e2e", "TPOT": "tpot", "ITL": "itl"}


class TailRuns:
    """Scenario traces under ``root``, by name (tail_scenarios.CASES, or any name its ``build`` knows)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._paths: dict[str, Path] = {}
        self._docs: dict[str, dict[str, Any]] = {}

    def path(self, name: str) -> Path:
        if name not in self._paths:
            self._paths[name] = build(self.root, name)
        return self._paths[name]

    def doc(self, name: str) -> dict[str, Any]:
        """``tracetool analyze --json`` of the scenario, as the command prints it."""
        if name not in self._docs:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = cli_main(["analyze", "--json", str(self.path(name))])
            assert code == 0, f"analyze --json {name}: exit {code}"
            self._docs[name] = json.loads(out.getvalue())
        return self._docs[name]

    def tail_findings(self, name: str) -> dict[str, dict[str, Any]]:
        """The tail findings of the analysis by id, each with the metric and level its detail is about
        (a tail finding's detail starts with its tail, e.g. ``p99 TTFT (10 requests above ...``)."""
        out = {}
        for f in self.doc(name)["findings"]:
            if f["id"].startswith("tail-"):
                level, metric = f["detail"].split(" ", 2)[:2]
                out[f["id"]] = {**f, "level": level, "metric": METRIC_KEYS[metric]}
        return out


__all__ = ["METRIC_KEYS", "TailRuns"]
