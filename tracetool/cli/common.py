"""Pieces every command shares: output options, JSON on stdout, notes on stderr."""

from __future__ import annotations

import functools
import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

from tracetool.glyphs import NOT_MEASURED
from tracetool.untrusted import echo

F = TypeVar("F", bound=Callable[..., Any])


def json_option(fn: F) -> F:
    """``--json``: emit the command's documented, versioned JSON on stdout instead of text."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print machine-readable JSON on stdout (schema in docs/).")(fn)


def html_option(fn: F) -> F:
    """``--html FILE``: also write the self-contained HTML page with the plots (the ``html`` extra)."""
    return click.option("--html", "html_file", type=click.Path(path_type=Path), metavar="FILE",
                        help="Also write a self-contained HTML page with the plots to FILE (needs the html "
                             "extra: pip install 'tracetool-llm[html]').")(fn)


def need_html(html_file: Path | None) -> None:
    """Refuse ``--html`` at once (exit 2, one line) when matplotlib is missing, before any analysis."""
    if html_file is not None:
        from tracetool.report.html import require

        require()


def said_page(written: Any) -> None:
    """One line on stderr: where the page went and its size."""
    images = f", {len(written.images)} figures beside it" if written.images else ""
    warn(f"wrote {written.page} ({written.bytes / 1e6:.2f} MB{images})")


def _check_preset(kind: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A callback that refuses an unknown preset or dtype while the options are parsed (exit 2),
    before any trace is read or anything drawn."""

    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None:
            from tracetool import presets

            {"model": presets.model_preset, "gpu": presets.gpu_preset, "dtype": presets.dtype_bytes}[kind](value)
        return value

    return check


_ROOFLINE_FIELDS = ("model", "gpu", "gpus", "weight_dtype", "kv_dtype")


def roofline_options(fn: F) -> F:
    """The roofline options every analysing command shares (``analyze``, ``tui``, ``attach``,
    ``report``); the command gets them in one ``analysis:``
    :class:`~analyzers.options.AnalysisOptions` argument, to which it adds its other analysis
    options (claims, thresholds, memory, engine)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from analyzers.options import AnalysisOptions

        analysis = AnalysisOptions(**{k: kwargs.pop(k) for k in _ROOFLINE_FIELDS})
        return fn(*args, analysis=analysis, **kwargs)

    opts = [
        click.option("--model", callback=_check_preset("model"),
                     help="Model preset (llama-3.1-8b, qwen2.5-72b, ...) or a config.json path, for the "
                          "roofline; overrides meta.json."),
        click.option("--gpu", callback=_check_preset("gpu"),
                     help="GPU preset (h100-sxm, a100-80gb, h200, mi300x, ...); overrides meta.json."),
        click.option("--gpus", "--tp", "gpus", type=click.IntRange(min=1), help="GPUs the model is sharded over."),
        click.option("--weight-dtype", callback=_check_preset("dtype"),
                     help="Weight dtype for --model (bf16, fp8, int4, ...)."),
        click.option("--kv-dtype", callback=_check_preset("dtype"),
                     help="KV-cache dtype for --model (bf16, fp8, ...)."),
    ]
    out: Any = wrapper
    for opt in reversed(opts):
        out = opt(out)
    return out


def old_spelling(old: str, new: str, dest: str, **option: Any) -> Callable[[F], F]:
    """Keep accepting ``old``, the former name of the option ``new`` (value ``dest``), hidden from
    ``--help``, with a one-line notice on stderr; both at once is a usage error. Put it above the
    ``new`` option."""
    hidden = f"old_{dest}"

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            value = kwargs.pop(hidden)
            if value is not None:
                if kwargs.get(dest) is not None:
                    from tracetool.errors import UsageError

                    raise UsageError(f"{old} is the old name of {new}: give one of them")
                warn(f"{old} is now {new} here (the old name still works, for now)")
                kwargs[dest] = value
            return fn(*args, **kwargs)

        out: Any = click.option(old, hidden, default=None, hidden=True, **option)(wrapper)
        return out

    return decorate


def emit_json(obj: Any) -> None:
    """Write one JSON document to stdout."""
    sys.stdout.write(json.dumps(obj, indent=2, default=_default, allow_nan=False) + "\n")


def _default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    return str(o)


def warn(message: str) -> None:
    """A diagnostic line on stderr (stdout is data), outside text in it escaped."""
    echo(f"tracetool: {message}", err=True)


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """While inside, SIGTERM (``kill``, ``timeout``, a cancelled CI job) does what Ctrl-C does:
    the SIGINT handler in force runs (asyncio's cancels the run, Python's raises
    KeyboardInterrupt), so the same clean-up saves the trace and the command exits 130; where
    SIGINT is ignored (a background job of a script) it raises KeyboardInterrupt itself.
    Only the main thread takes signals: elsewhere nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        on_int = signal.getsignal(signal.SIGINT)
        if callable(on_int):
            on_int(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def fmt_int(n: int | None) -> str:
    return NOT_MEASURED if n is None else f"{n:,}"


