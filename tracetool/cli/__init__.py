"""The ``tracetool`` command line: a thin layer over the library.

Commands load lazily (``COMMANDS`` maps a name to ``module:function`` and its
one-line help), so ``tracetool --help`` and light commands never import
torch, DuckDB or Textual.

Exit codes (docs/cli.md): 0 ok, 1 a threshold or budget failed, 2 usage
error, 3 bad input, 130 interrupted. Expected failures print one line on
stderr; stdout carries only data.
"""

from __future__ import annotations

import importlib
import io
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from tracetool import __version__
from tracetool.errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    TRACEBACK_ENV,
    TracetoolError,
    one_line,
)
from tracetool.untrusted import echo

#: name -> ("module:function", one-line help). Adding a command is one line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("tracetool.cli.trace_cmds:validate", "Check a trace against the v1 contract."),
    "info": ("tracetool.cli.trace_cmds:info", "Summarise a trace: requests, tokens, span, tables."),
    "convert": ("tracetool.cli.trace_cmds:convert", "Rewrite a trace as parquet/arrow/arrows, one file per table."),
    "analyze": ("tracetool.cli.analyze_cmd:analyze", "Where the latency went, and which story about it is wrong."),
    "estimate": ("tracetool.cli.analyze_cmd:estimate", "Napkin math without a trace: decode step, prefill, TTFT, e2e."),
    "serve": ("tracetool.cli.serve_cmd:serve",
              "Run an OpenAI-compatible server (demo or local model) that records a trace."),
    "probe": ("tracetool.cli.serve_cmd:probe",
              "Load-test an OpenAI-compatible endpoint; TTFT/TPOT/ITL/e2e and a client trace."),
    "merge": ("tracetool.cli.serve_cmd:merge", "Join a client trace and a server trace on request id."),
    "demo": ("tracetool.cli.demo_cmd:demo", "Serve the demo model, probe it, and show where the latency went."),
    "record": ("tracetool.cli.record_cmd:record", "Run a Python program with the collectors and write its trace."),
    "import": ("tracetool.cli.import_cmd:import_", "Import a vLLM bench / GenAI-Perf / AIPerf / OTLP file as a trace."),
    "receive": ("tracetool.cli.receive_cmd:receive",
                "Receive OpenTelemetry spans (OTLP gRPC/HTTP) from vLLM, SGLang, TGI as a trace."),
    "export": ("tracetool.cli.export_cmd:export", "Export a trace as Chrome trace-event JSON for ui.perfetto.dev."),
    "report": ("tracetool.cli.report_cmd:report",
               "CI latency report and pass/fail gate: baseline, budgets, md/json/junit."),
    "diff": ("tracetool.cli.diff_cmd:diff",
             "Two traces of one workload side by side: which components moved, and by how much."),
    "tui": ("tracetool.cli.tui_cmd:tui",
            "Browse a trace in the terminal: where the time went, which story is wrong."),
    "attach": ("tracetool.cli.attach_cmd:attach",
               "Watch running servers live in the TUI, or record their stream headless."),
}


class LazyGroup(click.Group):
    """A group whose commands are imported only when run (or asked for help)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = COMMANDS.get(cmd_name)
        if spec is None:
            return None
        module, _, attr = spec[0].partition(":")
        cmd = getattr(importlib.import_module(module), attr)
        assert isinstance(cmd, click.Command)
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracetool")
def cli() -> None:
    """tracetool: where the latency of an LLM server goes, per request and per token.

    Record per-token traces (record, serve, probe), attribute latency to network,
    queueing, tokenizer, prefill and decode (analyze), and catch the usual
    misdiagnoses with measured evidence. Exit codes: 0 ok, 1 threshold failed,
    2 usage, 3 bad input, 130 interrupted.
    """


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    code = run(argv)
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # `tracetool ... | head`: not an error
        _silence_stdout()
    return code


def run(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        rv: Any = cli.main(args=args, prog_name="tracetool", standalone_mode=False)
    except click.exceptions.UsageError as e:
        shown_usage = io.StringIO()  # the usage text quotes the arguments: escaped as the rest
        e.show(file=shown_usage)
        echo(shown_usage.getvalue().rstrip("\n"), err=True, limit=None, newlines=True)
        return EXIT_USAGE
    except click.exceptions.Exit as e:
        return int(e.exit_code or 0)
    except (click.exceptions.Abort, KeyboardInterrupt):
        echo("tracetool: interrupted", err=True)
        return EXIT_INTERRUPTED
    except TracetoolError as e:
        echo(f"tracetool: error: {e}", err=True)  # errors quote paths and values from the input
        return e.exit_code
    except click.ClickException as e:
        echo(f"tracetool: error: {e.format_message()}", err=True)
        return EXIT_USAGE if e.exit_code == 2 else EXIT_BAD_INPUT
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except MemoryError as e:  # pyarrow's ArrowMemoryError too: a corrupt length or a decompression bomb
        detail = one_line(e, 200)
        echo(f"tracetool: error: out of memory reading the input{f' ({detail})' if detail else ''}: "
             "a corrupt length or a table far larger than this machine can hold", err=True)
        return EXIT_BAD_INPUT
    except Exception as e:  # a bug: one line and its own exit code, the traceback on request
        detail = one_line(e)
        echo(f"tracetool: internal error: {type(e).__name__}{f': {detail}' if detail else ''} (a bug in "
             f"tracetool: {TRACEBACK_ENV}=1 shows where; please report it with that)", err=True)
        if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
            import traceback

            traceback.print_exc(file=sys.stderr)
        return EXIT_INTERNAL
    return int(rv or 0) if isinstance(rv, int) else 0


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
