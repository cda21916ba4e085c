"""Where a new trace goes: one rule for every command that writes one (``serve``, ``record``,
``probe``, ``receive``, ``attach --record``, ``merge``, ``import``, ``convert``).

A directory that holds something already is refused unless the user says ``--force``; with it,
the trace files in it (tables and ``meta.json``) are removed before the new trace is written, so
no table of an earlier trace (a ``gpu`` table the new run does not record, a segment of a longer
one) is read as part of the new trace. Other files are left where they are.
"""

from __future__ import annotations

from pathlib import Path

from tracetool.errors import BadInput, UsageError
from tracetool.schema import EXTENSIONS, META_FILE

#: What refuses a directory that is not empty, on every command.
NOT_EMPTY = "exists and is not empty (use --force to replace the trace in it)"


def check_output(out: Path, force: bool) -> None:
    """Refuse ``out`` before any work when it cannot take a new trace (a command that reads its
    inputs first, then writes: :func:`prepare_output` clears it when the trace is written).

    Raises:
        UsageError: ``out`` is a file, or holds something and ``force`` is false (exit 2).
        BadInput: ``out`` cannot be listed (exit 3).
    """
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a directory")
    try:
        full = out.is_dir() and any(out.iterdir())
    except OSError as e:
        raise BadInput(f"{out}: cannot be read ({e.strerror or e})") from e
    if full and not force:
        raise UsageError(f"{out}: {NOT_EMPTY}")


def prepare_output(out: Path, force: bool, *, create: bool = True) -> None:
    """Make ``out`` ready to hold a new trace: new, empty, or (``force``) cleared of trace files.

    ``create=False`` checks and clears only (a writer that creates the directory itself).

    Raises:
        UsageError: ``out`` is a file, or holds something and ``force`` is false (exit 2).
        BadInput: ``out`` cannot be created or cleared (exit 3).
    """
    check_output(out, force)
    try:
        if out.is_dir():
            for p in out.iterdir():
                if p.is_file() and (p.suffix.lstrip(".") in EXTENSIONS or p.name == META_FILE):
                    p.unlink()
        if create:
            out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"{out}: cannot be prepared for a trace ({e.strerror or e})") from e


__all__ = ["NOT_EMPTY", "check_output", "prepare_output"]
