"""``diff``: two traces of one workload side by side (docs/cli.md). Thin layer over
:mod:`tracetool.report.diff`."""

from __future__ import annotations

from pathlib import Path

import click

from tracetool.cli.common import emit_json, json_option


@click.command()
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@json_option
@click.option("--tui", "tui", is_flag=True, help="Open the diff in the terminal UI.")
def diff(a: Path, b: Path, as_json: bool, tui: bool) -> int:
    """Compare two traces of one workload: which components moved, and by how much.

    \b
        tracetool diff before-trace after-trace
        tracetool diff before-trace after-trace --json

    A is before, B after. For TTFT, ITL, TPOT and e2e: p50 and p95 of each,
    the change, and the CI gate's bootstrap interval (requests resampled as
    units; docs/ci-reports.md). For every component of the attribution: its
    ms per request and share of e2e in each, and the change with a bootstrap
    interval. `top` names the component that moved most, and a one-line
    headline says it ("+18 % p95 TTFT, all in queue"). --tui opens the same
    diff in the terminal UI. Exit 0, 3 when a trace cannot be analysed.
    """
    from tracetool.report.diff import diff as run_diff
    from tracetool.report.diff import print_diff

    doc = run_diff(a, b)
    if tui:
        from tracetool.tui.diff_app import DiffApp

        DiffApp(doc).run()
    elif as_json:
        emit_json(doc)
    else:
        print_diff(doc)
    return 0
