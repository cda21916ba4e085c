"""Where the traces a viewer shows come from: files on disk now, a live stream next.

The TUI (and anything else that re-analyses traces as they change) reads traces
only through a :class:`TraceSource`. It never asks whether the traces come
from files or from a socket; it asks for a snapshot, shows the source's status
line, and re-analyses on a timer when the source is live:

* :class:`DirectorySource` (here): trace directories, or directories of traces,
  read once. ``live`` is False, so the viewer analyses once (and again only
  when the user asks for a reload).
* :class:`~tracetool.live.source.LiveSource` (``tracetool attach``, also
  importable from here; loaded only when asked for): ``live`` is True and
  ``refresh_s`` says how often to take a new snapshot; ``snapshot()`` returns
  a sliding window of recent rows as :class:`~tracetool.reader.Trace`
  objects, one per server, so several servers show side by side and combined.
  ``status()`` says per server whether it is connected ("b: disconnected,
  retrying in 2 s"), and the viewer shows that line in its header.

This module is on headless paths (the CLI imports it before any UI): it must
not import textual or DuckDB.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol, runtime_checkable

from tracetool.errors import BadInput
from tracetool.reader import Trace, find_traces, open_trace


@runtime_checkable
class TraceSource(Protocol):
    """A provider of traces to analyse, static or live.

    Attributes:
        label: what the header shows for the source: a trace name, "3 traces",
            or the address(es) of live servers.
        live: True when the traces change over time; the viewer then calls
            :meth:`snapshot` every ``refresh_s`` seconds and re-analyses.
        refresh_s: seconds between snapshots of a live source (0.2 for 5 Hz);
            ignored when ``live`` is False.
    """

    @property
    def label(self) -> str: ...

    @property
    def live(self) -> bool: ...

    @property
    def refresh_s(self) -> float: ...

    def snapshot(self) -> list[Trace]:
        """The traces to analyse now (a live source: the current sliding window).

        Returns an empty list when a live source has no data yet.

        Raises:
            BadInput: the traces cannot be read (a static source raises this from
                its first snapshot, so a bad trace fails before any UI starts).
        """
        ...

    def status(self) -> str:
        """One short line for the header: "file", "connected", "disconnected, retrying in 2 s"."""
        ...

    def close(self) -> None:
        """Release files, sockets and threads; the source is not used afterwards."""
        ...


class DirectorySource:
    """Trace directories (or directories of traces) read from disk.

    The traces are opened on the first :meth:`snapshot` (or :meth:`open`) and kept:
    files of a finished recording do not change. :meth:`reload` re-reads them,
    for a recording that was still being written.

    Args:
        paths: trace directories, or directories holding several traces.
        strict: treat a cut stream tail as an error (as ``tracetool validate`` does).
    """

    live = False
    refresh_s = 0.0

    def __init__(self, paths: Iterable[str | os.PathLike[str]], *, strict: bool = False) -> None:
        self.paths: list[Path] = [Path(p) for p in paths]
        if not self.paths:
            raise BadInput("no trace given")
        self.strict = strict
        self._lock = threading.Lock()
        self._traces: list[Trace] | None = None
        self._dirs: list[Path] | None = None

    @property
    def label(self) -> str:
        dirs = self._dirs
        if dirs is None:
            return self.paths[0].name if len(self.paths) == 1 else f"{len(self.paths)} paths"
        return dirs[0].name if len(dirs) == 1 else f"{len(dirs)} traces"

    def open(self) -> list[Trace]:
        """Read every trace now; raises :class:`BadInput` (or its ``TraceFormatError``) on a bad one."""
        with self._lock:
            if self._traces is None:
                dirs = find_traces(self.paths)
                self._traces = [open_trace(d, strict=self.strict) for d in dirs]
                self._dirs = dirs
            return list(self._traces)

    def snapshot(self) -> list[Trace]:
        return self.open()

    def reload(self) -> list[Trace]:
        """Forget the traces read and read them again."""
        with self._lock:
            self._traces = None
        return self.open()

    def status(self) -> str:
        return "file"

    @property
    def warnings(self) -> list[str]:
        """Reader warnings of the traces read so far (a cut stream, an unclosed recording)."""
        return [w for t in (self._traces or []) for w in t.warnings]

    def close(self) -> None:
        with self._lock:
            self._traces = None


def __getattr__(name: str) -> object:
    # LiveSource lives in tracetool.live (it loads pyarrow.flight): imported on first use only,
    # so `tracetool tui` on files never pays for it.
    if name == "LiveSource":
        from tracetool.live.source import LiveSource

        return LiveSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DirectorySource", "TraceSource"]  # and LiveSource, lazily (__getattr__)
