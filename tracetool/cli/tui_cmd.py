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
from typing import TYPE_CHECKING, Any

import click

from tracetool.cli.common import roofline_options, warn
from tracetool.errors import UsageError

if TYPE_CHECKING:
    from analyzers.options import AnalysisOptions


@click.command()
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@roofline_options
@click.option("--theme", type=click.Choice(["dark", "light"]), default="dark", show_default=True,
              help="Colour theme (T toggles it in the app).")
@click.option("--group-by", "group_by", metavar="KEY,...",
              help="Dataset keys (key=value folder names) whose groups g picks from; default: the outermost key.")
@click.option("--timings", type=click.Path(path_type=Path), hidden=True,
              help="Write start-up phase times as JSON at first paint (benchmarks/bench_tui.py).")
def tui(traces: tuple[Path, ...], analysis: AnalysisOptions, theme: str, group_by: str | None,
        timings: Path | None) -> int:
    """Browse where the time went in TRACES, and which story about it is wrong.

    TRACES are trace directories, or datasets: directory trees of traces (several
    are shown together and one by one: t switches). A dataset's key=value folder
    names (server=a/hour=10/) group its traces: g picks a group (--group-by,
    default the outermost key) and every screen shows that group's traces; its
    unreadable traces are set aside with a warning. Screens: 1 Overview (the e2e
    waterfall, TTFT/ITL/TPOT/e2e percentiles, the bottleneck, the Diagnosis of
    the usual suspects), 2 Decode (ITL over token index and against kv_len with
    the fit and the roofline, per-request vs aggregate tok/s), 3 GPU/CPU (NVML
    and py-spy over time), 4 Requests (sortable; Enter opens one), 5 SQL (a
    read-only DuckDB console over the trace and the analyzer views). h tests a
    hypothesis ("it's the network"), ? shows every key, q quits (exit 0).
    Needs a terminal. Exit 3 when a trace cannot be read or analysed (a dataset:
    when none can), 2 for an unknown preset or --group-by key.
    """
    marks: dict[str, float] = {"cli": time.time()}
    from tracetool.trace_source import DirectorySource
    from tracetool.tui import launch
    from tracetool.tui.model import ALL, analyse

    keys = None if group_by is None else [k.strip() for k in group_by.split(",") if k.strip()]
    source = DirectorySource(traces, group_by=keys)
    source.open()  # an unknown key, or a trace that cannot be read, fails here, before anything is drawn
    for w in source.warnings:  # also shown in the app; here they outlive it, as analyze's do
        warn(w)
    marks["read"] = time.time()
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise UsageError("tracetool tui needs an interactive terminal (stdin and stderr must be a TTY); "
                         "use tracetool analyze for text or --json")
    options = analysis
    # Imports hold the GIL: import the analyzers here, so that the thread below runs DuckDB
    # (which releases it) while this thread imports textual, instead of two imports taking turns.
    import analyzers  # noqa: F401

    marks["analyzers"] = time.time()
    first: Future[Any] = Future()

    def run() -> None:
        try:
            # several traces: the first paint waits for their analysis together only; the app then
            # analyses each alone in the background (a 50-trace dataset: one analysis, not 51)
            # a big trace: a first look (the requests' figures) is painted first, each token's gap follows
            first.set_result(analyse(source, options, generation=1, only=ALL, first_look=True))
        except BaseException as e:  # handed to the app, then re-raised here
            first.set_exception(e)
        marks["analyzed"] = time.time()

    threading.Thread(target=run, name="tracetool-analyse", daemon=True).start()
    # launch imports textual while DuckDB analyses (it releases the GIL)
    return launch(source, options, initial=first, theme=theme, timings=marks, timings_path=timings)
