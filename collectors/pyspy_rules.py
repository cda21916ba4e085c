"""Category rules for py-spy samples: loading ``pyspy_rules.toml`` (and the user's files) and applying them.

The rules file documents the semantics; in short, a stack is walked from its
innermost frame outwards, a ``[[boundary]]`` frame ends the walk as ``other``,
and the first ``[[rule]]`` matching a frame decides. Verdicts are cached per
frame, so classifying costs a dict lookup per frame once warm.
"""

from __future__ import annotations

import fnmatch
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracetool.errors import BadInput

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CATEGORIES = ("tokenize", "model-forward", "sampling", "detokenize", "network-io", "serialization",
              "idle", "other")
RULES_FILE = Path(__file__).with_name("pyspy_rules.toml")


@dataclass(frozen=True)
class Rule:
    """One ``[[rule]]`` or ``[[boundary]]`` of a rules file, compiled."""

    category: str
    modules: re.Pattern[str] | None
    names: re.Pattern[str] | None       # patterns without a dot: the function's own name
    qualnames: re.Pattern[str] | None   # patterns with a dot: the qualified name
    leaf: bool
    source: str

    def matches(self, name: str, path: str, depth: int) -> bool:
        if self.leaf and depth:
            return False
        if self.modules is not None and not self.modules.search(path):
            return False
        if self.names is None and self.qualnames is None:
            return self.modules is not None
        short = name.rsplit(".", 1)[-1]
        return bool((self.names is not None and self.names.match(short))
                    or (self.qualnames is not None and self.qualnames.match(name)))


def _compile(patterns: Iterable[str], anywhere: bool) -> re.Pattern[str] | None:
    parts = [fnmatch.translate(p.lower()) for p in patterns]
    if not parts:
        return None
    if anywhere:  # a module pattern matches anywhere in the path
        parts = [fnmatch.translate(f"*{p.lower()}*") for p in patterns]
    return re.compile("|".join(f"(?:{p})" for p in parts))


class Rules:
    """Boundaries and category rules, applied leaf first (see ``pyspy_rules.toml``)."""

    def __init__(self, boundaries: list[Rule], rules: list[Rule], sources: list[str]) -> None:
        self.boundaries = boundaries
        self.rules = rules
        self.sources = sources
        self._frames: dict[tuple[str, str, bool], str | None] = {}

    def classify(self, frames: Sequence[tuple[str, str]]) -> str:
        """The category of a stack given leaf first as ``(function, file path)`` pairs."""
        for depth, (name, path) in enumerate(frames):
            key = (name, path, depth == 0)
            if key in self._frames:
                found = self._frames[key]
            else:
                found = self._frames[key] = self._frame(name.lower(), path.replace("\\", "/").lower(), depth)
            if found is not None:
                return found
        return "other"

    def _frame(self, name: str, path: str, depth: int) -> str | None:
        """A frame's verdict: a category, ``other`` at a boundary, None to go on outwards."""
        for b in self.boundaries:
            if b.matches(name, path, depth):
                return "other"
        for r in self.rules:
            if r.matches(name, path, depth):
                return r.category
        return None


def load_rules(extra: Sequence[str | os.PathLike[str]] = ()) -> Rules:
    """The default rules, with the user's files first (so they override).

    Raises :class:`BadInput` naming the file when one is unreadable or malformed.
    """
    boundaries: list[Rule] = []
    rules: list[Rule] = []
    sources = [str(p) for p in extra] + [str(RULES_FILE)]
    for src in sources:
        b, r = _read_rules_file(Path(src))
        boundaries += b
        rules += r
    return Rules(boundaries, rules, sources)


def _read_rules_file(path: Path) -> tuple[list[Rule], list[Rule]]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise BadInput(f"{path}: cannot read py-spy rules ({e.strerror or e})") from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"{path}: not valid TOML ({e})") from e
    except RecursionError:  # tomllib recurses per nested array or inline table
        raise BadInput(f"{path}: not valid TOML (nested too deeply)") from None
    unknown = set(data) - {"version", "rule", "boundary"}
    if unknown:
        raise BadInput(f"{path}: unknown top-level key(s) {sorted(unknown)} (expected [[rule]] and [[boundary]])")
    return ([_rule(path, i, t, boundary=True) for i, t in enumerate(_tables(path, data, "boundary"))],
            [_rule(path, i, t, boundary=False) for i, t in enumerate(_tables(path, data, "rule"))])


def _tables(path: Path, data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise BadInput(f"{path}: {key} must be an array of tables ([[{key}]])")
    return value


def _rule(path: Path, index: int, table: dict[str, Any], boundary: bool) -> Rule:
    where = f"{path}: [[{'boundary' if boundary else 'rule'}]] #{index + 1}"
    allowed = {"modules", "functions", "leaf"} | (set() if boundary else {"category"})
    extra = set(table) - allowed
    if extra:
        raise BadInput(f"{where}: unknown key(s) {sorted(extra)} (allowed: {sorted(allowed)})")
    category = "other" if boundary else table.get("category")
    if category not in CATEGORIES:
        raise BadInput(f"{where}: category must be one of {', '.join(CATEGORIES)}, got {category!r}")
    lists = {}
    for key in ("modules", "functions"):
        v = table.get(key, [])
        if not isinstance(v, list) or not all(isinstance(p, str) and p for p in v):
            raise BadInput(f"{where}: {key} must be a list of non-empty strings")
        lists[key] = v
    if not lists["modules"] and not lists["functions"]:
        raise BadInput(f"{where}: needs modules, functions or both")
    leaf = table.get("leaf", False)
    if not isinstance(leaf, bool):
        raise BadInput(f"{where}: leaf must be true or false")
    funcs = lists["functions"]
    return Rule(str(category), _compile(lists["modules"], anywhere=True),
                _compile([f for f in funcs if "." not in f], anywhere=False),
                _compile([f for f in funcs if "." in f], anywhere=False), leaf, where)


