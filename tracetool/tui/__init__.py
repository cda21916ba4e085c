"""``tracetool tui``: a Textual viewer of where a trace's latency went, and which story is wrong.

The app (``tracetool.tui.app``) imports textual; ``model``, ``story`` and
``queries`` do not, so they are tested and benchmarked headless. Importing
this package itself loads nothing heavy.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analyzers.options import AnalysisOptions
    from tracetool.trace_source import TraceSource


def launch(source: TraceSource, options: AnalysisOptions, *, theme: str = "dark",
           initial: Future[Any] | None = None, timings: dict[str, float] | None = None,
           timings_path: Path | None = None) -> int:
    """Run the viewer on ``source`` until the user quits; the one way ``tui``, ``attach`` and
    ``demo`` open it. The source is closed on the way out, whatever happened.

    Args:
        source: an opened trace source (a directory of traces, or live servers).
        options: what the analyses are asked (the roofline options).
        theme: ``dark`` or ``light``.
        initial: the first analysis, already started (``tracetool tui`` runs it while textual
            is imported).
        timings, timings_path: start-up phase times (``imported``: textual and the app loaded),
            written as JSON at first paint (benchmarks/bench_tui.py).

    Returns:
        The exit code (0).

    Raises:
        The first analysis' error (:class:`~tracetool.errors.BadInput`, or
        :class:`~tracetool.errors.UsageError` for a bad preset) after the app closed.
    """
    try:
        import analyzers  # noqa: F401  (before textual: see tracetool.cli.tui_cmd)
        from tracetool.tui.app import TraceApp

        if timings is not None:
            timings["imported"] = time.time()

        app = TraceApp(source, options, initial=initial, theme=theme, timings=timings,
                       timings_path=timings_path)
        app.run()
    finally:
        source.close()
    if app.fatal is not None:  # the first analysis failed: one line, exit 3 (2 for a bad preset)
        raise app.fatal
    return app.return_code or 0


__all__ = ["launch"]
