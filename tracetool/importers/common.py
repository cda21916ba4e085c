"""What every importer shares: reading the source file, checking values, the imported request.

Importers turn another tool's benchmark file into a v1 trace holding what
that file knows. The file is untrusted input: structure that makes the whole
file unusable (not JSON, wrong top-level shape, parallel lists that disagree)
is a :class:`~tracetool.errors.BadInput` (exit 3, one line); a problem
confined to one request (a NaN, a negative gap, a wrong type) skips that
request and is counted in a note, so a partly broken file still imports what
it can and says what it left out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracetool.errors import BadInput

#: Timestamps must fit int64 with room for the sums the importers make.
MAX_NS = 1 << 62
#: int32 columns of the format (prompt_tokens, output_tokens, index, kv_len).
MAX_I32 = (1 << 31) - 1


class BadValue(ValueError):
    """A value of one request is unusable; the request is skipped (never escapes an importer)."""


@dataclass
class ImportedRequest:
    """One request as a benchmark client saw it. Times are client-clock nanoseconds."""

    request_id: str
    status: str = "ok"
    error: str | None = None
    #: When the request was sent; None when the file does not say (failed requests).
    start_ns: int | None = None
    #: When the last content chunk arrived (the tools' own end of a request).
    end_ns: int | None = None
    #: Arrival time of each streamed content chunk, in order: index 0 is the first token.
    token_ns: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    prompt_chars: int | None = None
    #: True when one chunk is one token, so ``kv_len = prompt_tokens + index`` holds.
    one_token_per_chunk: bool = False


class Skips:
    """Requests (or lines) left out, counted by reason, with a few examples each."""

    def __init__(self, examples: int = 3) -> None:
        self._by_reason: dict[str, list[str]] = {}
        self._examples = examples
        self.total = 0

    def add(self, where: str, reason: str) -> None:
        self.total += 1
        seen = self._by_reason.setdefault(reason, [])
        seen.append(where)

    def first(self, unit: str = "request", limit: int = 2) -> str:
        """The first few reasons, for a one-line error when nothing was usable."""
        notes = self.notes(unit)
        more = f"; and {len(notes) - limit} more reason(s)" if len(notes) > limit else ""
        return "; ".join(notes[:limit]) + more

    def notes(self, unit: str = "request") -> list[str]:
        out = []
        for reason, where in self._by_reason.items():
            shown = ", ".join(where[: self._examples]) + (", ..." if len(where) > self._examples else "")
            plural = unit if len(where) == 1 else f"{unit}s"
            out.append(f"skipped {len(where)} {plural} ({shown}): {reason}")
        return out


@dataclass
class ImportResult:
    """What an importer read: the requests, what it could not know, where the data came from."""

    tool: str
    source: Path
    requests: list[ImportedRequest]
    notes: list[str]
    #: ``relative`` (real gaps between requests, unknown epoch), ``epoch`` (Unix ns of the
    #: client host) or ``synthetic`` (every request at its own zero).
    timeline: str
    #: Facts about the source file kept in ``meta.json`` (version, date, model, ...).
    details: dict[str, Any] = field(default_factory=dict)
    skipped: int = 0


# -- reading files -----------------------------------------------------------------------

def read_text(path: Path, what: str) -> str:
    """The file's text; one clear :class:`BadInput` for every way it can be unreadable."""
    if not path.exists():
        raise BadInput(f"{path}: no such file (expected {what})")
    if path.is_dir():
        raise BadInput(f"{path}: is a directory (expected {what})")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise BadInput(f"{path}: cannot read ({e.strerror or e})") from e
    if not raw.strip():
        raise BadInput(f"{path}: empty file (expected {what})")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}: not UTF-8 text at byte {e.start} (expected {what})") from e


def read_json(path: Path, what: str) -> Any:
    """Parse a whole-file JSON document."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        cut = " (the file looks truncated)" if e.pos >= len(text.rstrip()) - 1 else ""
        if e.msg == "Extra data":
            cut = " (more than one JSON document: a JSON Lines file?)"
        raise BadInput(f"{path}: not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}{cut} "
                       f"(expected {what})") from e
    except RecursionError as e:
        raise BadInput(f"{path}: JSON nested too deeply (expected {what})") from e


def json_lines(text: str) -> Iterator[tuple[int, Any | None, str | None]]:
    """``(line number, value or None, error or None)`` for each non-blank line."""
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line), None
        except json.JSONDecodeError as e:
            yield n, None, f"not valid JSON ({e.msg} at column {e.colno})"
        except RecursionError:
            yield n, None, "JSON nested too deeply"


def type_name(v: Any) -> str:
    """The JSON name of a value's type, for messages."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "list"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


# -- checking values ---------------------------------------------------------------------

def number(v: Any, what: str) -> float:
    """A finite, non-negative JSON number."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadValue(f"{what} is a {type_name(v)}, not a number")
    x = float(v)
    if math.isnan(x) or math.isinf(x):
        raise BadValue(f"{what} is {v}")
    if x < 0:
        raise BadValue(f"{what} is negative ({v})")
    return x


def seconds_to_ns(v: Any, what: str) -> int:
    """Seconds (float) to integer nanoseconds, rounded to the nearest."""
    return scaled_ns(v, 1e9, what)


def scaled_ns(v: Any, per_unit_ns: float, what: str) -> int:
    """A duration in some unit to integer nanoseconds."""
    x = number(v, what) * per_unit_ns
    if not x < MAX_NS:  # also catches an overflow to inf
        raise BadValue(f"{what} is too large ({v})")
    return round(x)


def timestamp_ns(v: Any, what: str) -> int:
    """An integer nanosecond timestamp (floats holding an integer are accepted)."""
    x = number(v, what)
    if isinstance(v, float) and not x.is_integer():
        raise BadValue(f"{what} is not a whole number of nanoseconds ({v})")
    if x >= MAX_NS:
        raise BadValue(f"{what} is too large ({v})")
    return int(v)


def count(v: Any, what: str) -> int:
    """A token count: a non-negative integer that fits int32."""
    x = number(v, what)
    if not x.is_integer():
        raise BadValue(f"{what} is not a whole number ({v})")
    if x > MAX_I32:
        raise BadValue(f"{what} is too large ({v})")
    return int(x)


def optional_count(v: Any, what: str) -> int | None:
    return None if v is None else count(v, what)


def cumulative(first_ns: int, gaps_ns: list[int]) -> list[int]:
    """Chunk arrival times from the first one and the gaps between them (exact integers)."""
    out = [first_ns]
    t = first_ns
    for g in gaps_ns:
        t += g
        out.append(t)
    if t >= MAX_NS:
        raise BadValue("chunk times overflow")
    return out


# -- notes every imported trace carries --------------------------------------------------

CLIENT_ONLY_NOTE = (
    "client side only: the file holds no server timings, so network, queue, tokenize, prefill, "
    "decode and other are not measurable; e2e (the client.request span), TTFT and the gaps "
    "between streamed chunks are")
EMIT_NS_NOTE = (
    "tokens.emit_ns is a copy of tokens.client_recv_ns (client clock) because the server clock "
    "was not recorded; each token row is one streamed content chunk as the tool timed it")
CHUNK_NOTE = (
    "{n} of {total} requests report more output tokens than streamed chunks (a chunk can carry "
    "several tokens): their token rows are chunks, their kv_len is left null, and ITL from these "
    "rows is the gap between chunks (as the tool itself reports it)")


def chunk_note(requests: list[ImportedRequest]) -> list[str]:
    """A note when chunks are not tokens; marks the requests where they are."""
    mismatched = 0
    ok = 0
    for r in requests:
        if r.status != "ok" or not r.token_ns:
            continue
        ok += 1
        if r.output_tokens is not None and r.output_tokens != len(r.token_ns):
            mismatched += 1
            r.one_token_per_chunk = False
        else:
            r.one_token_per_chunk = r.output_tokens is not None
    return [CHUNK_NOTE.format(n=mismatched, total=ok)] if mismatched else []
