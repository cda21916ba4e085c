"""``tracetool export TRACE --perfetto OUT.json``: a trace for ui.perfetto.dev."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from tracetool.cli.common import emit_json, fmt_int, json_option, warn
from tracetool.errors import BadInput
from tracetool.untrusted import echo


@click.command()
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--perfetto", "out", type=click.Path(path_type=Path, allow_dash=True), required=True,
              help="Write Chrome trace-event JSON here ('-' for stdout); open it in ui.perfetto.dev.")
@json_option
def export(trace: Path, out: Path, as_json: bool) -> int:
    """Export TRACE as Chrome trace-event JSON that opens in ui.perfetto.dev.

    Each request gets its own track (one under "server", one under "client":
    the two clocks are unrelated, so each starts at its own zero) holding its
    spans as nested slices and one instant per token (args: index, kv_len);
    engine steps and GPU metrics become a track and counter tracks under
    "engine". Timestamps are microseconds with nanosecond decimals. The file is
    streamed out, so large traces do not build the JSON in memory.
    See docs/perfetto.md.
    """
    from tracetool.export_perfetto import export_perfetto
    from tracetool.reader import open_trace

    to_stdout = str(out) == "-"
    if as_json and to_stdout:
        raise click.UsageError("--json needs --perfetto FILE: stdout already carries the trace JSON")
    t = open_trace(trace)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        if to_stdout:
            stats = export_perfetto(t, sys.stdout)
        else:
            with open(tmp, "w", encoding="utf-8") as f:
                stats = export_perfetto(t, f)
            os.replace(tmp, out)
    except OSError as e:
        raise BadInput(f"{out}: cannot write ({e.strerror or e})") from e
    finally:
        if not to_stdout and tmp.exists():
            tmp.unlink()
    for w in t.warnings:
        warn(w)
    if as_json:
        emit_json({"schema": "tracetool.export/1", "path": str(out), **stats.as_dict()})
    elif not to_stdout:
        echo(f"wrote {out}: {fmt_int(stats.events)} events ({fmt_int(stats.requests)} requests, "
             f"{fmt_int(stats.spans)} spans, {fmt_int(stats.tokens)} tokens, "
             f"{fmt_int(stats.counter_samples)} GPU samples); open it in https://ui.perfetto.dev")
    return 0
