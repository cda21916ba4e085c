"""Numbers as the screens print them: units always, tracetool.glyphs.NOT_MEASURED for what was not measured;
and text from the trace as they show it (:func:`text`, :func:`cell`)."""

from __future__ import annotations

from rich.text import Text

from tracetool import units
from tracetool.glyphs import NOT_MEASURED
from tracetool.untrusted import NAME_LIMIT, TEXT_LIMIT, shown


def text(value: object, limit: int = TEXT_LIMIT) -> str:
    """Text from the trace or a server (an id, a name, a label, a message) as a screen shows it:
    escaped and cut by :func:`tracetool.untrusted.shown`. Give it to ``Content`` as plain text
    (``Content(...)``, ``Content.styled``, a part of ``Content.assemble``), never as markup."""
    return shown(value, limit)


def fit(value: object, width: int) -> str:
    """Outside text in a column ``width`` characters wide: escaped, and cut with ``…`` to fit."""
    s = shown(value, width)
    return s if len(s) <= width else s[:max(0, width - 1)] + "…"


def cell(value: object, limit: int = NAME_LIMIT, justify: str = "left") -> Text:
    """A DataTable cell holding text from outside: a ``str`` cell is read as markup (a request id
    ``[@click=app.quit]`` would be an action); a ``Text`` never is."""
    return Text(shown(value, limit), justify=justify)  # type: ignore[arg-type]


def ms(x: float | None, digits: int | None = None) -> str:
    """Milliseconds on screen: :func:`tracetool.units.ms` (digits by size unless given), with µs below
    0.1 ms where a fixed 0.05 ms would read as zero."""
    return units.ms(x, digits, micro=True)


def pct(share: float | None) -> str:
    """A 0..1 share as percent, with more digits for tiny shares (0.008 %, not 0.0 %)."""
    if share is None:
        return NOT_MEASURED
    p = share * 100
    if p == 0 or abs(p) >= 0.1:
        return f"{p:.1f} %"
    return f"{p:.1g} %" if abs(p) >= 0.001 else "<0.001 %"


#: A count or a rate (:func:`tracetool.units.number`, the reports' too).
num = units.number


def count(n: int | None) -> str:
    return NOT_MEASURED if n is None else f"{n:,}"


def tok_s(x: float | None) -> str:
    if x is None:
        return NOT_MEASURED
    return f"{x:,.1f} tok/s" if x < 100 else f"{x:,.0f} tok/s"


def seconds(s: float | None) -> str:
    if s is None:
        return NOT_MEASURED
    return units.ms(s * 1000, 0) if s < 1 else f"{s:,.2f} s"


def axis(x: float) -> str:
    """A short tick label: 1.2k, 35, 0.25."""
    a = abs(x)
    if a >= 1e6:
        return f"{x / 1e6:.1f}M"
    if a >= 1e4:
        return f"{x / 1e3:.0f}k"
    if a >= 1e3:
        return f"{x / 1e3:.1f}k"
    if a >= 10 or float(x).is_integer():
        return f"{x:.0f}"
    if a >= 1:
        return f"{x:.1f}"
    return f"{x:.2g}"
