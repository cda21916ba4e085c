"""Pieces every command shares: output options, JSON on stdout, notes on stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
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
