"""``diff``: two traces of one workload side by side (docs/cli.md). Thin layer over
:mod:`tracetool.report.diff`."""

from __future__ import annotations

from pathlib import Path

import click

from tracetool.cli.common import emit_json, html_option, json_option, need_html, said_page


@click.command()
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@json_option
@click.option("--tui", "tui", is_flag=True, help="Open the diff in the terminal UI.")
@html_option
def diff(a: Path, b: Path, as_json: bool, tui: bool, html_file: Path | None) -> int:
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
    diff in the terminal UI. --html FILE also writes the diff as a page: each
    component's change with its interval, the moved one first. Exit 0, 2 for
    --html without matplotlib, 3 when a trace cannot be analysed.
    """
    from tracetool.report.diff import diff as run_diff
    from tracetool.report.diff import print_diff

    need_html(html_file)
    doc = run_diff(a, b)
    if html_file is not None:
        from tracetool.report.html import diff_page, write

        said_page(write(diff_page(doc), html_file))
    if tui:
        from tracetool.tui.diff_app import DiffApp

        DiffApp(doc).run()
    elif as_json:
        emit_json(doc)
    else:
        print_diff(doc)
    return 0
