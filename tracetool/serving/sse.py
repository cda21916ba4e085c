"""Server-Sent Events and Server-Timing parsing for the probe (no dependency beyond the stdlib).

The SSE parser follows the WHATWG event-stream rules the OpenAI-style servers
rely on: lines end in LF, CRLF or CR; ``data:`` lines of one event are joined
with LF; a blank line dispatches the event; ``:`` lines are comments
(keep-alives); other fields (``event:``, ``id:``, ``retry:``) are ignored, and
so are lines that are not fields at all, as the spec says; the first such line
is kept in :attr:`SSEParser.junk` so a stream that never completes can say why.
Bytes are split into lines before decoding, so a UTF-8 character cut between
two network chunks is decoded whole.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

from tracetool.untrusted import clip

#: Longest line accepted: a server streaming megabytes without a newline is broken.
MAX_LINE_BYTES = 8 << 20


class MalformedStream(Exception):
    """The response is not a well-formed OpenAI-style event stream."""


class SSEParser:
    """Feed bytes as they arrive; get the ``data`` of each complete event."""

    def __init__(self) -> None:
        self._buf = b""
        #: Pieces of an unfinished line that held no line end, joined once one arrives: a long
        #: line then costs one copy, not one per network chunk (8 MiB in 64 KiB reads was 0.5 GB).
        self._more: list[bytes] = []
        self._more_len = 0
        self._data: list[str] = []
        #: The first line that was not an SSE field (ignored, remembered for error messages).
        self.junk: str | None = None

    def feed(self, chunk: bytes) -> Iterator[str]:
        if not self._buf.endswith(b"\r") and b"\n" not in chunk and b"\r" not in chunk:
            self._more.append(chunk)
            self._more_len += len(chunk)
            if len(self._buf) + self._more_len > MAX_LINE_BYTES:
                raise MalformedStream(f"a line longer than {MAX_LINE_BYTES} bytes")
            return
        buf = b"".join((self._buf, *self._more, chunk))
        self._more.clear()
        self._more_len = 0
        start = 0
        n = len(buf)
        while start < n:
            i = _next_eol(buf, start)
            if i < 0:
                break
            line = buf[start:i]
            if buf[i:i + 1] == b"\r":
                if i + 1 == n:  # a CR at the end of the chunk may be half of CRLF: wait
                    break
                nxt = i + 2 if buf[i + 1:i + 2] == b"\n" else i + 1
            else:
                nxt = i + 1
            start = nxt
            event = self._line(line)
            if event is not None:
                yield event
        self._buf = buf[start:]
        if len(self._buf) > MAX_LINE_BYTES:
            raise MalformedStream(f"a line longer than {MAX_LINE_BYTES} bytes")

    def close(self) -> Iterator[str]:
        """End of stream: a last line without newline, and an event without its blank line."""
        if self._more:
            self._buf = b"".join((self._buf, *self._more))
            self._more.clear()
            self._more_len = 0
        if self._buf:
            rest, self._buf = self._buf.rstrip(b"\r"), b""
            event = self._line(rest)
            if event is not None:
                yield event
        if self._data:
            data, self._data = "\n".join(self._data), []
            yield data

    def _line(self, raw: bytes) -> str | None:
        if not raw:
            if self._data:
                data, self._data = "\n".join(self._data), []
                return data
            return None
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MalformedStream(f"not UTF-8 text: {raw[:40]!r}") from e
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name not in ("event", "id", "retry") and self.junk is None:
            self.junk = clip(line, 80)
        return None


def _next_eol(buf: bytes, start: int) -> int:
    a = buf.find(b"\n", start)
    b = buf.find(b"\r", start)
    if a < 0:
        return b
    if b < 0:
        return a
    return min(a, b)


#: Longest duration taken as a timing (about 11.6 days, in ms): beyond it a reported number is
#: no timing (and its nanoseconds would not fit a trace's int64 columns).
MAX_DURATION_MS = 1e9
_METRIC_RE = re.compile(r"^\s*([!#$%&'*+\-.^_`|~0-9A-Za-z]+)\s*(.*)$")
_DUR_RE = re.compile(r"(?:^|;)\s*dur\s*=\s*\"?([0-9.eE+\-]+)\"?")


def parse_server_timing(value: str) -> dict[str, float]:
    """``{"server": 12.3, "queue": 0.1}`` (milliseconds) from a W3C Server-Timing header value.

    Metrics without a ``dur`` are skipped; the first of repeated names wins, as the spec says.
    """
    out: dict[str, float] = {}
    for part in value.split(","):
        m = _METRIC_RE.match(part)
        if not m:
            continue
        name, params = m.group(1), m.group(2)
        d = _DUR_RE.search(params)
        if d is None or name in out:
            continue
        try:
            ms = float(d.group(1))
        except ValueError:
            continue
        if math.isfinite(ms) and 0 <= ms <= MAX_DURATION_MS:  # "dur=1e999" or "dur=-1" is no timing
            out[name] = ms
    return out
