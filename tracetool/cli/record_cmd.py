"""``tracetool record``: run an unmodified Python program and record its inference as a trace."""

from __future__ import annotations

from pathlib import Path

import click

from collectors.launcher import run_recording
from tracetool.cli.attach_cmd import live_config, live_options
from tracetool.cli.metrics_options import metrics_options
from tracetool.cli.samplers import chosen_samplers, sampler_options


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Trace directory to write (created; must be empty unless --force).")
@click.option("--force", is_flag=True, help="Replace the trace in a non-empty output directory.")
@sampler_options
@live_options
@metrics_options(auto=False)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def record(output: Path, force: bool, command: tuple[str, ...], live: str | None, live_token: str | None,
           live_tls_cert: Path | None, live_tls_key: Path | None, live_flush_s: float | None,
           metrics_url: str | None = None, metrics_interval: float = 1.0, **samplers: float | None) -> int:
    """Run COMMAND (a Python program) with tracetool's collectors and write a trace.

    \b
        tracetool record -o trace -- python generate.py --max-new-tokens 64

    No code changes: transformers' generate and tokenizers are patched when the
    program imports them (like opentelemetry-instrument), each batch row
    becomes a request with tokenize/prefill/decode/detokenize spans and one
    row per generated token, and every forward pass of the model becomes a
    `steps` row. The trace is written also when the program raises or is
    interrupted; tracetool then exits with the program's own exit code
    (130 after Ctrl-C). A program that never uses torch gets a valid, empty
    trace and a one-line note. A summary line goes to stderr; the program's
    stdout is left alone. With --live HOST:PORT the program also streams its
    trace to `tracetool attach` viewers while it runs (docs/live.md). With
    --metrics-url URL, tracetool scrapes that server's Prometheus metrics into
    the trace while the program runs (docs/serving.md, "Engine metrics").
    """
    chosen = chosen_samplers(samplers)
    live_cfg = live_config(live, live_token, live_tls_cert, live_tls_key, live_flush_s)
    metrics = None
    if metrics_url is not None:
        from collectors.prometheus import metrics_url as checked

        metrics = (checked(metrics_url), metrics_interval)
    return run_recording(list(command), output, force=force, samplers=chosen, live=live_cfg, metrics=metrics)
