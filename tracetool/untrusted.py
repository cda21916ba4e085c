"""Text from outside, as tracetool shows it: control characters escaped, long text cut with a mark.

A trace, a server and a file someone sent are not ours: a ``meta.json`` note, a request id or a
span name received over OTLP, a server's error message, a model name from ``/metrics`` labels, a
trace's folder name can hold anything. Written raw to a terminal, an OSC sequence sets the
window title (``ESC ] 0 ; ... BEL``), makes a hyperlink (OSC 8) or writes the clipboard
(OSC 52); DCS and the 8-bit C1 controls (U+009B is CSI) act on some terminals; bidi overrides
reorder what is read (Trojan Source); a lone surrogate cannot be encoded at all. And a 100 MB
note printed in full is a denial of service of its own.

:func:`shown` is the one place that decides what such text looks like on every output path
(the CLI's text, its stderr lines, the reports, the TUI); the renderers add their own format's
escaping (Markdown, XML, Textual markup) on top of it. The escapes are Python's and C's, as
``repr`` and ``git``'s quoted paths write them: ``\\x1b``, ``\\x9b``, ``\\u202e``, ``\\n``.
Backslashes are left as they are (``C:\\Users`` stays readable), so the shown form is for
people, not a reversible encoding: ``--json`` output is the exact data (JSON escapes what it
must, :func:`json_escaped` the rest).
"""

from __future__ import annotations

import re
import sys

#: Characters never written raw:
#: C0 controls and DEL (U+0000-U+001F, U+007F), C1 controls (U+0080-U+009F; U+009B is the 8-bit
#: CSI, U+009D OSC, U+0090 DCS), the Unicode bidi marks, embeddings, overrides and isolates
#: (U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069), the line and paragraph separators
#: (U+2028, U+2029: line breaks to some terminals and editors), lone surrogates (U+D800-U+DFFF:
#: not encodable, so printing them raises), and U+FFFE/U+FFFF (not characters; XML forbids them).
_CLASS = ("\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
          "\ud800-\udfff\ufffe\uffff")
UNSAFE = re.compile(f"[{_CLASS}]")
#: Text with no unsafe character (for an input field's ``restrict``: a paste holding one is refused).
SAFE_TEXT = f"[^{_CLASS}]*"
#: One unsafe character, or a run of safe ones.
_TOKEN = re.compile(f"[{_CLASS}]|[^{_CLASS}]+")

#: Default length of one piece of text (a note, an error message), in characters shown.
TEXT_LIMIT = 1_000
#: Length of a name (request id, span name, label, key): where it sits in a column or a line.
NAME_LIMIT = 200
#: Length of a whole line written by a sink (stderr diagnostics): the backstop.
LINE_LIMIT = 4_000

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_char(ch: str) -> str:
    """The visible form of one unsafe character: ``\\n``, ``\\x1b``, ``\\u202e``."""
    if ch in _SHORT:
        return _SHORT[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def cut_mark(hidden: int) -> str:
    """What ends cut text: how many characters were left out."""
    return f"…[+{hidden:,} char{'' if hidden == 1 else 's'}]"


def clip(text: str, limit: int) -> str:
    """``text`` cut after ``limit`` characters, with :func:`cut_mark` saying how many were left out.

    For outside text that is kept or passed on rather than printed (an error stored in a trace, a
    message quoted inside another): it stays exact, short of the cut, and a reader sees it was
    cut. Escaping is :func:`shown`'s, where it is printed."""
    return text if len(text) <= limit else text[:limit] + cut_mark(len(text) - limit)


def shown(text: object, limit: int | None = TEXT_LIMIT, *, newlines: bool = False) -> str:
    """``text`` as it may be printed: every unsafe character (:data:`UNSAFE`) escaped, and cut
    after ``limit`` characters of output with :func:`cut_mark` (``None``: never cut).

    ``newlines=True`` keeps ``\\n`` as a line break (a multi-line document written by a sink);
    everything else that is unsafe is still escaped. Work is bounded by ``limit``, not by the
    length of ``text``: a 100 MB note costs as much as a short one. Escaping twice changes
    nothing (the escaped form holds no unsafe character)."""
    s = text if isinstance(text, str) else str(text)
    if limit is None:
        return UNSAFE.sub(lambda m: _visible(m.group(), newlines), s)
    out: list[str] = []
    size = used = 0  # characters written, characters of ``s`` consumed
    for m in _TOKEN.finditer(s[:limit]):  # each source character shows as one or more
        token = m.group()
        if UNSAFE.match(token):
            rep = _visible(token, newlines)
            if size + len(rep) > limit:
                break
            out.append(rep)
            size, used = size + len(rep), used + 1
        else:
            take = token[:limit - size]
            out.append(take)
            size, used = size + len(take), used + len(take)
        if size >= limit:
            break
    if used < len(s):
        out.append(cut_mark(len(s) - used))
    return "".join(out)


def _visible(ch: str, newlines: bool) -> str:
    return ch if newlines and ch == "\n" else escape_char(ch)


def echo(line: object = "", *, err: bool = False, limit: int | None = LINE_LIMIT, newlines: bool = False) -> None:
    """Print one line that may hold outside text (on stderr with ``err``), as :func:`shown` makes it.

    The sink every text output of tracetool goes through, whatever its fields were made of: a
    field someone forgot to pass through :func:`shown` still cannot reach the terminal raw, nor
    break the line in two. ``newlines=True`` for a block of lines written at once."""
    print(shown(line, limit, newlines=newlines), file=sys.stderr if err else sys.stdout, flush=err)


def json_escaped(document: str) -> str:
    """A JSON document (``json.dumps(..., ensure_ascii=False)``) with every unsafe character
    written as its ``\\uXXXX`` escape: the same data to a JSON reader, nothing raw on a terminal.

    json.dumps escapes the C0 controls inside strings itself; the newlines and tabs left raw are
    the document's own whitespace and stay. What it leaves raw otherwise (DEL, C1, bidi
    controls, separators, lone surrogates) can only stand inside strings, where the escape is
    valid."""
    return UNSAFE.sub(lambda m: m.group() if m.group() in _JSON_WHITESPACE else f"\\u{ord(m.group()):04x}",
                      document)


_JSON_WHITESPACE = frozenset("\n\r\t")


__all__ = ["LINE_LIMIT", "NAME_LIMIT", "SAFE_TEXT", "TEXT_LIMIT", "UNSAFE", "clip", "cut_mark", "echo", "escape_char",
           "json_escaped", "shown"]
