"""Datasets: a directory tree of traces read as one, hive-style folder names as grouping keys.

A fleet records a trace per server per hour; laid out as
``DATASET/server=a/hour=2026-12-05T10/`` (any depth, any key names), every
``key=value`` folder between the dataset's root and a trace (the trace's own
folder included) gives that trace a key, so ``--group-by server`` can analyse
each server's traces together. A folder without ``=`` adds no key; a trace that
lacks a key another trace has gets none for it (``null`` in the JSON).

Reading a dataset is forgiving trace by trace: a trace that cannot be read is set
aside with its one-line reason (the caller warns, or fails under ``--strict``), the
others are analysed. What cannot be mixed is refused as a whole: traces of
different format versions (one line naming both).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from tracetool.errors import BadInput, TracetoolError, UsageError
from tracetool.reader import Trace, open_trace, walk_traces
from tracetool.schema import META_FILE


@dataclass(frozen=True)
class Member:
    """One trace of a dataset: its directory, its label and its hive keys (folder order)."""

    path: Path
    label: str
    keys: tuple[tuple[str, str], ...] = ()

    def key(self, name: str) -> str | None:
        return dict(self.keys).get(name)


@dataclass
class Dataset:
    """The traces found under some paths, with the keys their folders give them.

    Attributes:
        members: every trace directory found, in path order.
        keys: every key name, in the order the folders give them (outermost first).
        is_tree: True when a path was a directory of traces rather than a trace (the
            forgiving mode: broken traces are set aside, not fatal).
    """

    members: list[Member]
    keys: list[str] = field(default_factory=list)
    is_tree: bool = False


@dataclass
class Opened:
    """A dataset's readable traces and what could not be read."""

    traces: list[tuple[Member, Trace]]
    bad: list[tuple[Member, str]]

    def trace_list(self) -> list[Trace]:
        return [t for _, t in self.traces]


def hive_keys(parts: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``key=value`` path components as (key, value), percent-escapes decoded (as Hive writes them)."""
    out: list[tuple[str, str]] = []
    for part in parts:
        k, sep, v = part.partition("=")
        if sep and k:
            out.append((unquote(k), unquote(v)))
    return tuple(out)


def discover(paths: Sequence[str | os.PathLike[str]]) -> Dataset:
    """Find the traces under ``paths``: each is a trace, or a directory tree holding traces.

    Raises:
        BadInput: a path does not exist, or a directory holds no trace at any depth.
    """
    members: list[Member] = []
    is_tree = False
    for raw in paths:
        p = Path(raw)
        if p.name == META_FILE and p.is_file():
            p = p.parent
        if not p.exists():
            raise BadInput(f"{p}: no such file or directory")
        if not p.is_dir() or (p / META_FILE).exists():
            members.append(Member(p, p.name or str(p), hive_keys([p.name])))
            continue
        found = walk_traces(p)
        if not found:
            raise BadInput(f"{p}: neither a trace nor a directory of traces (no {META_FILE} found at any depth)")
        is_tree = True
        for d in found:
            rel = d.relative_to(p).parts
            members.append(Member(d, "/".join(rel), hive_keys(rel)))
    keys: list[str] = []
    for m in members:
        for k, _ in m.keys:
            if k not in keys:
                keys.append(k)
    return Dataset(members, keys, is_tree)


def check_versions(members: Sequence[Member]) -> None:
    """Refuse a dataset whose traces declare different format versions (one line, names one of each).

    A meta.json that cannot be read is left to the reader, which names what is wrong with it.
    """
    seen: dict[object, Path] = {}
    for m in members:
        try:
            version = json.loads((m.path / META_FILE).read_text(encoding="utf-8")).get("version")
        except (OSError, ValueError, AttributeError, RecursionError):
            continue
        if isinstance(version, (int, str)) and not isinstance(version, bool):
            seen.setdefault(version, m.path)
    if len(seen) > 1:
        which = ", ".join(f"version {v} ({p})" for v, p in sorted(seen.items(), key=lambda kv: str(kv[0])))
        raise BadInput(f"the dataset mixes trace versions: {which}; convert them to one version first")


def open_members(ds: Dataset, *, forgiving: bool | None = None, lazy: bool = False,
                 strict: bool = False) -> Opened:
    """Read every member; in a tree (or when ``forgiving``), set unreadable ones aside.

    ``lazy`` leaves canonical Parquet tables on disk, ``strict`` treats a cut stream tail as
    an error (:func:`tracetool.reader.open_trace`).

    Raises:
        BadInput: mixed versions; or, outside the forgiving mode, the first unreadable trace;
            or every trace unreadable (the first one's reason).
    """
    check_versions(ds.members)
    forgive = ds.is_tree if forgiving is None else forgiving
    good: list[tuple[Member, Trace]] = []
    bad: list[tuple[Member, str]] = []
    for m in ds.members:
        try:
            good.append((m, open_trace(m.path, lazy=lazy, strict=strict)))
        except TracetoolError as e:
            if not forgive:
                raise
            bad.append((m, str(e)))
    if not good:
        raise BadInput(bad[0][1] if len(bad) == 1 else f"no readable trace among {len(bad)}: {bad[0][1]}")
    return Opened(good, bad)


def parse_memory(text: str) -> int:
    """``4GB``, ``512MiB``, ``1.5G``, ``30%`` (of physical memory) -> bytes.

    Raises:
        UsageError: anything else, or less than 64 MiB.
    """
    t = text.strip().upper().replace(" ", "")
    units = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "KIB": 2**10, "M": 10**6, "MB": 10**6, "MIB": 2**20,
             "G": 10**9, "GB": 10**9, "GIB": 2**30, "T": 10**12, "TB": 10**12, "TIB": 2**40}
    try:
        if t.endswith("%"):
            n = int(float(t[:-1]) / 100 * physical_memory())
        else:
            i = len(t) - len(t.lstrip("0123456789."))
            num, unit = t[:i], t[i:]
            if not num or unit not in units:
                raise ValueError(text)
            n = int(float(num) * units[unit])
    except ValueError:
        raise UsageError(f"--memory-limit {text}: not a size (say 4GB, 512MiB or 50%)") from None
    if n < 64 * 2**20:
        raise UsageError(f"--memory-limit {text}: below 64 MiB, too little to analyse in")
    return n


#: ``--memory-limit``'s default: this share of physical memory.
DEFAULT_MEMORY_FRACTION = 0.5


def physical_memory() -> int:
    """Bytes of physical memory (4 GiB where the system does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 4 * 2**30


def process_rss() -> int:
    """Bytes this process holds in physical memory now (0 where the system does not say)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0


#: Of a ``--memory-limit``, the share kept back from DuckDB for what Python holds while it analyses
#: (each analysis' per-request tables, the JSON document) and the allocators' slack.
PYTHON_RESERVE = 0.25


def engine_budget(limit: int) -> int:
    """What DuckDB may hold so that the whole process stays within ``limit`` bytes: the limit less
    what the process holds already (the interpreter, pyarrow, DuckDB's code, the traces' footers)
    and :data:`PYTHON_RESERVE` of it; never under 64 MiB.
    """
    return max(64 * 2**20, int(limit * (1 - PYTHON_RESERVE)) - process_rss())


def group_keys(ds: Dataset, group_by: Sequence[str] | None) -> list[str]:
    """The keys to group by: those asked for (each must exist), else the outermost key, else none.

    Raises:
        UsageError: a key no folder of the dataset gives.
    """
    if group_by is None:
        return ds.keys[:1]
    for k in group_by:
        if k not in ds.keys:
            have = ", ".join(ds.keys) or "none (no key=value folders)"
            raise UsageError(f"--group-by {k}: no such key in the dataset (keys: {have})")
    return list(group_by)


def groups(members: Sequence[Member], keys: Sequence[str]) -> list[tuple[dict[str, str | None], list[Member]]]:
    """Members grouped by their values of ``keys``, groups in order of first appearance."""
    out: dict[tuple[str | None, ...], list[Member]] = {}
    for m in members:
        out.setdefault(tuple(m.key(k) for k in keys), []).append(m)
    return [(dict(zip(keys, vals, strict=True)), ms) for vals, ms in out.items()]


__all__ = [
    "DEFAULT_MEMORY_FRACTION",
    "Dataset",
    "Member",
    "Opened",
    "check_versions",
    "discover",
    "engine_budget",
    "group_keys",
    "groups",
    "hive_keys",
    "open_members",
    "parse_memory",
    "physical_memory",
    "process_rss",
]
