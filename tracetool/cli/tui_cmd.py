"""``tracetool tui``: open traces in the Textual viewer.

The traces are read before the app starts, so a trace that cannot be read is
one line on stderr and exit 3, never a half-drawn screen or a traceback. The
first analysis starts in a thread right after, while textual is imported and
the app starts (DuckDB releases the GIL): that overlap is most of what makes
the first paint fast (benchmarks/bench_tui.py). If that analysis fails (no
requests in the trace, an unknown preset) the app closes and the error is the
same one line, exit 3 (2 for a preset).
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import click

from tracetool.cli.common import Roofline, roofline_options
from tracetool.errors import UsageError


@click.command()
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@roofline_options
@click.option("--theme", type=click.Choice(["dark", "light"]), default="dark", show_default=True,
              help="Colour theme (T toggles it in the app).")
@click.option("--timings", type=click.Path(path_type=Path), hidden=True,
              help="Write start-up phase times as JSON at first paint (benchmarks/bench_tui.py).")
def tui(traces: tuple[Path, ...], roofline: Roofline, theme: str, timings: Path | None) -> int:
    """Browse where the time went in TRACES, and which story about it is wrong.

    TRACES are trace directories, or directories of traces (several are shown
    together and one by one: t switches). Screens: 1 Overview (the e2e
    waterfall, TTFT/ITL/TPOT/e2e percentiles, the bottleneck, the Diagnosis of
    the usual suspects), 2 Decode (ITL over token index and against kv_len with
    the fit and the roofline, per-request vs aggregate tok/s), 3 GPU/CPU (NVML
    and py-spy over time), 4 Requests (sortable; Enter opens one), 5 SQL (a
    read-only DuckDB console over the trace and the analyzer views). h tests a
    hypothesis ("it's the network"), ? shows every key, q quits (exit 0).
    Needs a terminal. Exit 3 when a trace cannot be read or analysed, 2 for an
    unknown preset.
    """
    marks: dict[str, float] = {"cli": time.time()}
    from tracetool.trace_source import DirectorySource
    from tracetool.tui import launch
    from tracetool.tui.model import AnalysisOptions, analyse

    source = DirectorySource(traces)
    source.open()  # a trace that cannot be read fails here, before anything is drawn
    marks["read"] = time.time()
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise UsageError("tracetool tui needs an interactive terminal (stdin and stderr must be a TTY); "
                         "use tracetool analyze for text or --json")
    options = AnalysisOptions(**roofline.kwargs())
    # Imports hold the GIL: import the analyzers here, so that the thread below runs DuckDB
    # (which releases it) while this thread imports textual, instead of two imports taking turns.
    import analyzers  # noqa: F401

    marks["analyzers"] = time.time()
    first: Future[Any] = Future()

    def run() -> None:
        try:
            first.set_result(analyse(source, options, generation=1))
        except BaseException as e:  # handed to the app, then re-raised here
            first.set_exception(e)
        marks["analyzed"] = time.time()

    threading.Thread(target=run, name="tracetool-analyse", daemon=True).start()
    # launch imports textual while DuckDB analyses (it releases the GIL)
    return launch(source, options, initial=first, theme=theme, timings=marks, timings_path=timings)
