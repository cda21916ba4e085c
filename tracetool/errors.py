"""One small error hierarchy, converted to an exit code and one line at the CLI.

Library code raises these (``raise BadInput(...) from e``); the CLI prints
``tracetool: error: <message>`` on stderr and exits with ``exit_code``.
"""

from __future__ import annotations

from tracetool.untrusted import clip

EXIT_OK = 0
EXIT_THRESHOLD = 1
EXIT_USAGE = 2
EXIT_BAD_INPUT = 3
EXIT_INTERRUPTED = 130
#: A bug in tracetool (sysexits' EX_SOFTWARE), never 1: a CI gate must not read a crash as a failed threshold.
EXIT_INTERNAL = 70
#: Set (to anything but empty or 0), the CLI prints an internal error's traceback after its one line.
TRACEBACK_ENV = "TRACETOOL_TRACEBACK"


class TracetoolError(Exception):
    """Base of every expected failure. ``str(e)`` is the one line a user sees."""

    exit_code = EXIT_BAD_INPUT


class UsageError(TracetoolError):
    """The command line asks for something that cannot be done as asked."""

    exit_code = EXIT_USAGE


class BadInput(TracetoolError):
    """A file, trace or stream is unreadable or does not follow its contract."""

    exit_code = EXIT_BAD_INPUT


class TraceFormatError(BadInput):
    """A trace breaks the v1 contract; the message names file, table and column."""

    def __init__(self, message: str, *, path: str | None = None, table: str | None = None,
                 column: str | None = None) -> None:
        where = ": ".join(p for p in (path, _table_col(table, column)) if p)
        super().__init__(f"{where}: {message}" if where else message)
        self.path = path
        self.table = table
        self.column = column


class ThresholdFailed(TracetoolError):
    """A budget or regression gate failed: the run worked, the result did not pass."""

    exit_code = EXIT_THRESHOLD


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception's message on one line, cut after ``limit`` characters with a mark (for one stderr line)."""
    return clip(" ".join(str(e).split()), limit)


def _table_col(table: str | None, column: str | None) -> str | None:
    if table and column:
        return f"table {table}, column {column}"
    if table:
        return f"table {table}"
    return None
