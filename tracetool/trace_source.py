"""Where the traces a viewer shows come from: files on disk now, a live stream next.

The TUI (and anything else that re-analyses traces as they change) reads traces
only through a :class:`TraceSource`. It never asks whether the traces come
from files or from a socket; it asks for a snapshot, shows the source's status
line, and re-analyses on a timer when the source is live:

* :class:`DirectorySource` (here): trace directories, or datasets (directory
  trees of traces, hive-style ``key=value`` folders grouping them), read once.
  ``live`` is False, so the viewer analyses once (and again when the user asks
  for a reload or picks another group of the dataset).
* :class:`~tracetool.live.source.LiveSource` (``tracetool attach``; it loads
  pyarrow.flight, so it lives in tracetool.live, which imports this module and
  never the other way round): ``live`` is True and
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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tracetool.dataset import Dataset, Member, discover, group_keys, groups, open_members
from tracetool.errors import BadInput
from tracetool.reader import Trace


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

    @property
    def warnings(self) -> list[str]:
        """What the viewer should say once: reader warnings, traces set aside (empty: none)."""
        ...

    def reload(self) -> Any:
        """Read the traces again (``r``); a source that reads nothing ahead does nothing."""
        ...

    def cycle_window(self) -> str | None:
        """Move to the next sliding window (``w``) and describe it; None: the source has no window."""
        ...


class SourceDefaults:
    """The answers of a source that has none of its own: no warnings, nothing to re-read, no
    sliding window. Sources inherit it for the members of :class:`TraceSource` they do not need."""

    @property
    def warnings(self) -> list[str]:
        return []

    def reload(self) -> Any:
        return None

    def cycle_window(self) -> str | None:
        return None


@runtime_checkable
class GroupedSource(Protocol):
    """A source whose traces fall into groups (a dataset's ``key=value`` folders).

    The viewer asks for one group's traces with :meth:`labelled` and analyses them
    alone; which group is shown is the viewer's state, not the source's, so a
    snapshot being analysed never changes under the analysis.
    """

    def groups(self) -> list[TraceGroup]:
        """The groups (empty: the traces are not grouped, and the viewer offers no picker)."""
        ...

    def labelled(self, group: str | None = None) -> list[tuple[str, Trace]]:
        """(label, trace) of a group's traces, or of every trace (None)."""
        ...

    def describe(self, group: str | None) -> str:
        """The header's words for a group (None: every trace), ``server=a · 3 traces``."""
        ...

    @property
    def group_by(self) -> list[str]:
        """The keys the traces are grouped by."""
        ...


@dataclass(frozen=True)
class TraceGroup:
    """The traces of a dataset that share the values of the ``--group-by`` keys.

    Attributes:
        name: the key values as the header and the picker show them, ``server=a`` or
            ``server=a, hour=10`` (a trace without a key: ``server=(none)``); unique in a source.
        keys: (key, value) in ``--group-by`` order; value None for a trace without the key.
        labels: the labels of the group's traces, in path order (as ``analyze`` labels them).
    """

    name: str
    keys: tuple[tuple[str, str | None], ...]
    labels: tuple[str, ...]


class DirectorySource(SourceDefaults):
    """Trace directories, or datasets (directory trees of traces), read from disk.

    The traces are opened on the first :meth:`snapshot` (or :meth:`open`) and kept:
    files of a finished recording do not change. :meth:`reload` re-reads them,
    for a recording that was still being written.

    A path that is a directory tree of traces is a dataset (:mod:`tracetool.dataset`):
    its traces are labelled by their path under the tree (as ``tracetool analyze``
    labels them), a trace that cannot be read is set aside with its reason
    (:attr:`bad`, :attr:`warnings`) instead of failing the whole, and its
    ``key=value`` folders group the traces (:meth:`groups`; ``group_by``, default
    the outermost key, as ``analyze --group-by``). :meth:`labelled` gives one
    group's traces, so a viewer can analyse a group alone.

    Args:
        paths: trace directories, or directories holding several traces.
        strict: treat a cut stream tail as an error (as ``tracetool validate`` does).
        group_by: the dataset keys to group by (None: the outermost key, if any).
    """

    live = False
    refresh_s = 0.0

    def __init__(self, paths: Iterable[str | os.PathLike[str]], *, strict: bool = False,
                 group_by: Sequence[str] | None = None) -> None:
        self.paths: list[Path] = [Path(p) for p in paths]
        if not self.paths:
            raise BadInput("no trace given")
        self.strict = strict
        self._group_by_asked = list(group_by) if group_by is not None else None
        self._lock = threading.Lock()
        self._traces: list[tuple[str, Trace]] | None = None
        self._dirs: list[Path] | None = None
        self._dataset: Dataset | None = None
        self._group_by: list[str] = []
        self._groups: list[TraceGroup] = []
        self._bad: list[tuple[Member, str]] = []

    @property
    def label(self) -> str:
        return self.describe(None)

    def describe(self, group: str | None) -> str:
        """The header's words for a group's traces (None: every trace): ``server=a · 3 traces``."""
        dirs = self._dirs
        if dirs is None:
            return self.paths[0].name if len(self.paths) == 1 else f"{len(self.paths)} paths"
        if not self._groups:
            return dirs[0].name if len(dirs) == 1 else f"{len(dirs)} traces"
        n = len(dirs) if group is None else len(self._group(group).labels)
        return f"{group or 'all'} · {n} trace{'s' if n != 1 else ''}"

    def open(self) -> list[Trace]:
        """Read every trace now.

        Raises:
            UsageError: a ``group_by`` key that no folder gives (before any trace is read).
            BadInput: a path that does not exist, a named trace that cannot be read (its
                ``TraceFormatError``), mixed versions, or no readable trace in a dataset.
        """
        with self._lock:
            if self._traces is None:
                ds = discover(self.paths)
                keys = group_keys(ds, self._group_by_asked)
                opened = open_members(ds, strict=self.strict)
                members = [m for m, _ in opened.traces]
                labels = _unique([m.label for m in members])
                self._traces = [(lab, t) for lab, (_, t) in zip(labels, opened.traces, strict=True)]
                self._dirs = [m.path for m in members]
                self._dataset, self._group_by, self._bad = ds, keys, opened.bad
                relabelled = [Member(m.path, lab, m.keys) for m, lab in zip(members, labels, strict=True)]
                self._groups = [
                    TraceGroup(", ".join(f"{k}={'(none)' if v is None else v}" for k, v in vals.items()),
                               tuple(vals.items()), tuple(m.label for m in ms))
                    for vals, ms in (groups(relabelled, keys) if keys else [])]
            return [t for _, t in self._traces]

    def snapshot(self) -> list[Trace]:
        return self.open()

    def labelled(self, group: str | None = None) -> list[tuple[str, Trace]]:
        """(label, trace) of a group's traces (None: every trace), reading them first if need be.

        Raises:
            BadInput: no such group.
        """
        self.open()
        pairs = list(self._traces or [])
        if group is None:
            return pairs
        wanted = set(self._group(group).labels)
        return [(lab, t) for lab, t in pairs if lab in wanted]

    def groups(self) -> list[TraceGroup]:
        """The dataset's groups, in order of first appearance; empty when no folder gives a key."""
        return list(self._groups)

    @property
    def keys(self) -> list[str]:
        """Every key the dataset's folders give (outermost first); empty before :meth:`open`."""
        return list(self._dataset.keys) if self._dataset is not None else []

    @property
    def group_by(self) -> list[str]:
        """The keys the traces are grouped by (the outermost key unless asked otherwise)."""
        return list(self._group_by)

    @property
    def bad(self) -> list[tuple[Path, str]]:
        """The traces of a dataset set aside as unreadable, with the reason."""
        return [(m.path, why) for m, why in self._bad]

    def _group(self, name: str) -> TraceGroup:
        for g in self._groups:
            if g.name == name:
                return g
        raise BadInput(f"no group {name!r} in the dataset")

    def reload(self) -> list[Trace]:
        """Forget the traces read and read them again."""
        with self._lock:
            self._traces = None
        return self.open()

    def status(self) -> str:
        n = len(self._bad)
        return "file" if not n else f"file · {n} unreadable trace{'s' if n != 1 else ''} set aside"

    @property
    def warnings(self) -> list[str]:
        """Reader warnings of the traces read so far (a cut stream, an unclosed recording), then one
        line per trace of a dataset set aside (``analyze`` says the same)."""
        return [*(w for _, t in (self._traces or []) for w in t.warnings),
                *(f"{m.path}: skipped: {why}" for m, why in self._bad)]

    def close(self) -> None:
        with self._lock:
            self._traces = None


def _unique(labels: Sequence[str]) -> list[str]:
    """Labels made distinct the way ``analyze`` makes them: a repeat gets ``#2``, ``#3``."""
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        n = seen.get(lab, 0)
        seen[lab] = n + 1
        out.append(lab if n == 0 else f"{lab}#{n + 1}")
    return out


__all__ = ["DirectorySource", "GroupedSource", "SourceDefaults", "TraceGroup", "TraceSource"]
