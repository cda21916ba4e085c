"""``tracetool import SOURCE FILE -o DIR``: another tool's benchmark file as a trace."""

from __future__ import annotations

from pathlib import Path

import click

from tracetool.cli.common import emit_json, fmt_int, json_option, warn
from tracetool.importers import SOURCES, import_file
from tracetool.untrusted import echo


@click.command(name="import")
@click.argument("source", type=click.Choice(sorted(SOURCES)), metavar="SOURCE")
@click.argument("file", type=click.Path(path_type=Path), metavar="FILE")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Trace directory to write (must not exist, or be empty).")
@click.option("--force", is_flag=True, help="Replace the trace files in a non-empty output directory.")
@json_option
def import_(source: str, file: Path, output: Path, force: bool, as_json: bool) -> int:
    """Import a benchmark FILE written by SOURCE as a trace in DIR.

    \b
    SOURCE is one of:
      vllm-bench   vLLM `bench serve --save-result --save-detailed` JSON
      genai-perf   GenAI-Perf profile_export.json
      aiperf       AIPerf profile_export.jsonl
      otlp         OpenTelemetry traces as OTLP JSON lines (the Collector's
                   file exporter): a server trace, as `tracetool receive`
                   writes, to join with a probe's trace (`tracetool merge`)

    For the benchmark tools, the trace holds what the file knows, all on the client side: one
    client.request span per successful request, one token row per streamed
    chunk (TTFT and chunk gaps equal the tool's numbers), and a requests row per
    request (token counts, status, error). meta.json notes say what could not be
    known (no server timings: network, queue, prefill and decode are not
    measurable) and which requests were skipped. Exit 3 with one line when the
    file is unreadable or not shaped as SOURCE writes it. See docs/importers.md.
    """
    summary = import_file(source, file, output, force=force)
    if as_json:
        emit_json({"schema": "tracetool.import/1", **summary})
    else:
        echo(f"imported {fmt_int(summary['requests'])} requests "
             f"({fmt_int(summary['requests_error'])} failed), {fmt_int(summary['tokens'])} tokens "
             f"from {file} -> {output}")
    if summary["skipped"]:
        warn(f"{summary['skipped']} request(s) skipped; `tracetool info {output}` lists why")
    return 0
