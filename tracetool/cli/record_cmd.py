"""``tracetool record``: run an unmodified Python program and record its inference as a trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from collectors.record import SAMPLERS, run_recording
from tracetool.cli.attach_cmd import live_config, live_options


def _sampler_options(fn: Any) -> Any:
    # one ``--<name>[=HZ]`` flag per registered sampler (collectors.record.SAMPLERS)
    for name, spec in sorted(SAMPLERS.items(), reverse=True):
        fn = click.option(f"--{name}", f"sampler_{name}", type=float, is_flag=False,
                          flag_value=spec.default_hz, default=None, metavar="[=HZ]",
                          help=f"{spec.help} Optional rate in Hz (default {spec.default_hz:g}).")(fn)
    return fn


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Trace directory to write (created; must be empty unless --force).")
@click.option("--force", is_flag=True, help="Replace the trace in a non-empty output directory.")
@_sampler_options
@live_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def record(output: Path, force: bool, command: tuple[str, ...], live: str | None, live_token: str | None,
           live_tls_cert: Path | None, live_tls_key: Path | None, **samplers: float | None) -> int:
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
    trace to `tracetool attach` viewers while it runs (docs/live.md).
    """
    chosen = {k.removeprefix("sampler_"): v for k, v in samplers.items() if v is not None}
    live_cfg = live_config(live, live_token, live_tls_cert, live_tls_key)
    return run_recording(list(command), output, force=force, samplers=chosen, live=live_cfg)
