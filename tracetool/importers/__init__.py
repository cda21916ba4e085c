"""Importers: benchmark files of other tools as v1 traces, so they can be analysed and gated.

Each source tool has one module with a ``parse(path) -> ImportResult``; the
shared pieces live in :mod:`tracetool.importers.common` and the trace is
written by :mod:`tracetool.importers.trace_out`. docs/importers.md says what
each file holds, what the trace gets and what cannot be known.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracetool.importers.common import ImportResult

#: source name on the command line -> (module, one-line description of the file it reads)
SOURCES: dict[str, tuple[str, str]] = {
    "vllm-bench": ("tracetool.importers.vllm_bench",
                   "vLLM `bench serve --save-result --save-detailed` result JSON"),
    "genai-perf": ("tracetool.importers.genai_perf", "GenAI-Perf / Perf Analyzer profile_export.json"),
    "aiperf": ("tracetool.importers.aiperf", "AIPerf profile_export.jsonl"),
    "otlp": ("tracetool.importers.otlp",
             "OpenTelemetry traces as OTLP JSON (the Collector's file exporter), as a server trace"),
}


def parser(source: str) -> Callable[[Path], ImportResult]:
    """The ``parse`` function of a source tool (KeyError for an unknown name)."""
    module = importlib.import_module(SOURCES[source][0])
    fn: Callable[[Path], ImportResult] = module.parse
    return fn


def import_file(source: str, path: str | Path, out: str | Path, *, force: bool = False) -> dict[str, Any]:
    """Read ``path`` as ``source`` wrote it and write a v1 trace to ``out``; return a summary.

    Raises:
        BadInput: the file is unreadable or not shaped as the tool writes it (exit 3).
        UsageError: ``out`` is not empty and ``force`` is false (exit 2).
    """
    from tracetool.importers.trace_out import write_trace

    module = importlib.import_module(SOURCES[source][0])
    if hasattr(module, "import_trace"):  # a source that writes its own trace (otlp: a server trace)
        summary: dict[str, Any] = module.import_trace(Path(path), Path(out), force=force)
        return summary
    result = parser(source)(Path(path))
    return write_trace(result, Path(out), force=force)
