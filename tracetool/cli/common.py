"""Pieces every command shares: output options, JSON on stdout, notes on stderr."""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def json_option(fn: F) -> F:
    """``--json``: emit the command's documented, versioned JSON on stdout instead of text."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print machine-readable JSON on stdout (schema in docs/).")(fn)


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
    """A diagnostic line on stderr (stdout is data)."""
    print(f"tracetool: {message}", file=sys.stderr)


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
    return "-" if n is None else f"{n:,}"


def fmt_ms(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x / 1000:.2f} s"
    return f"{x:.{digits}f} ms"


def fmt_pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f} %"
