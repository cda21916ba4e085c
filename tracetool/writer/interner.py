"""String interning for the packed sinks: rows carry int64 codes, the flusher turns them back."""

from __future__ import annotations

import threading
from collections.abc import Iterable


class Interner:
    """Maps strings to int64 codes for the packed buffers; thread-safe.

    Codes are never reused. A code can be retired (a finished request id) and
    is forgotten two flushes later, so a long-running server does not keep
    every request id it ever saw. A pinned code (:meth:`pin`) is never
    forgotten, so a producer may keep it (span names, clocks) instead of
    asking for it on every row.
    """

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}
        self._strings: dict[int, str] = {}
        self._next = 0
        self._lock = threading.Lock()
        self._retired: list[int] = []
        self._retiring: list[int] = []
        self._pinned: set[int] = set()

    def code(self, s: str) -> int:
        """The code of ``s``; the lock is taken only the first time ``s`` is seen."""
        c = self._codes.get(s)
        if c is None:
            with self._lock:
                c = self._codes.get(s)
                if c is None:
                    c = self._next
                    self._next += 1
                    self._strings[c] = s
                    self._codes[s] = c
        return c

    def pin(self, s: str) -> int:
        """The code of ``s``, kept for good (retiring it, as a request id that happens to equal
        a span name, does not make it forgotten)."""
        c = self.code(s)
        with self._lock:
            self._pinned.add(c)
        return c

    def retire(self, code: int) -> None:
        """Forget ``code`` two :meth:`collect` calls from now (rows still pending keep their string)."""
        self._retired.append(code)

    def lookup(self, codes: Iterable[int]) -> list[str | None]:
        """The strings of ``codes``; None for a null or a code already forgotten."""
        get = self._strings.get
        return [get(int(c)) for c in codes]

    def collect(self) -> None:
        """Called by the flusher after a drain: forget codes retired two drains ago."""
        with self._lock:
            old, self._retiring = self._retiring, self._retired
            self._retired = []
            for c in old:
                if c in self._pinned:
                    continue
                s = self._strings.pop(c, None)
                if s is not None and self._codes.get(s) == c:
                    del self._codes[s]

    def __len__(self) -> int:
        return len(self._strings)
