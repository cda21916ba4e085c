"""The page itself: one self-contained HTML file, no script, no external resource.

A :class:`Page` is a title, a lead paragraph and :class:`Section` objects, each either drawn
(a figure beside the numbers it shows, as text) or absent with the one-line reason why. The
CSS follows the reader's light or dark preference (``prefers-color-scheme``); figures take
their text and axis colour from it (``--fg``, :mod:`tracetool.report.html.figures`). Every
string that comes from a trace (labels, request ids, findings, paths) goes through
:func:`esc`: a trace is untrusted input.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from tracetool.glyphs import NOT_MEASURED
from tracetool.untrusted import shown

#: What the page's generator says about itself (in <meta name="generator">).
GENERATOR = "tracetool report --html"


def esc(text: Any) -> str:
    """``text`` as HTML text or an attribute value: shown as every output path shows outside text
    (:func:`tracetool.untrusted.shown`: control characters and bidi overrides escaped, long text
    cut), then ``& < > " '`` escaped."""
    return html.escape(shown(text), quote=True)


def num(text: str, key: str | None = None) -> str:
    """A number as shown, in a span; ``key`` is its path in the page's JSON document
    (``components.decode.ms``), so a reader (or a test) can find where it came from."""
    if key is None:
        return f'<span class="n">{esc(text)}</span>'
    return f'<span class="n" data-key="{esc(key)}">{esc(text)}</span>'


def table(header: list[str], rows: list[list[str]], align: str = "", caption: str | None = None) -> str:
    """A table; ``rows`` hold HTML (escape text with :func:`esc`, numbers with :func:`num`);
    ``align`` has ``l`` or ``r`` per column (default left). It scrolls inside its own box when it
    is wider than the column it is in, so the page never grows wider than the window."""
    def cls(i: int) -> str:
        return ' class="r"' if i < len(align) and align[i] == "r" else ""

    out = ['<div class="tw"><table>']
    if caption:
        out.append(f"<caption>{esc(caption)}</caption>")
    out.append("<thead><tr>" + "".join(f"<th{cls(i)}>{esc(h)}</th>" for i, h in enumerate(header)) + "</tr></thead>")
    out.append("<tbody>")
    for r in rows:
        out.append("<tr>" + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(r)) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


@dataclass
class Section:
    """One part of the page. Drawn: ``figures`` (inline SVG) beside ``body`` (HTML: the numbers
    as text). Absent: ``reason`` says in one line why there is nothing to draw."""

    id: str
    title: str
    body: str = ""
    figures: list[str] = field(default_factory=list)
    reason: str | None = None
    note: str | None = None  # e.g. "1,000 of 52,000 requests drawn": what was sampled or aggregated
    wide: bool = False  # the numbers under the figures, full width (a table of many columns), not beside

    @classmethod
    def absent(cls, id: str, title: str, reason: str) -> Section:
        return cls(id=id, title=title, reason=reason)

    def html(self) -> str:
        if self.reason is not None:
            return (f'<section id="{esc(self.id)}" class="absent" data-absent="true"><h2>{esc(self.title)}</h2>'
                    f'<p class="reason">Not drawn: {esc(self.reason)}</p></section>')
        figs = "".join(f"<figure>{f}</figure>" for f in self.figures)
        note = f'<p class="note">{esc(self.note)}</p>' if self.note else ""
        figs = f'<div class="figs">{figs}</div>' if figs else ""
        return (f'<section id="{esc(self.id)}" data-absent="false"><h2>{esc(self.title)}</h2>'
                f'<div class="pair{" wide" if self.wide else ""}">{figs}<div class="numbers">{self.body}</div></div>'
                f"{note}</section>")


@dataclass
class Page:
    """A whole page: ``lead`` is HTML under the title (the verdict in one sentence)."""

    title: str
    lead: str
    sections: list[Section]
    kind: str  # analysis, report, diff, sweep
    footer: str = ""

    def html(self) -> str:
        nav = " · ".join(f'<a href="#{esc(s.id)}">{esc(s.title)}</a>'
                         + ("" if s.reason is None else f" <small>({NOT_DRAWN})</small>") for s in self.sections)
        body = "".join(s.html() for s in self.sections)
        return (
            "<!DOCTYPE html>\n"
            f'<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta name="generator" content="{esc(GENERATOR)}">'
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'">'
            f"<title>{esc(self.title)}</title><style>{CSS}</style></head>"
            f'<body data-kind="{esc(self.kind)}"><header><h1>{esc(self.title)}</h1>'
            f'<p class="lead">{self.lead}</p><nav>{nav}</nav></header><main>{body}</main>'
            f"<footer>{self.footer}</footer></body></html>\n")


NOT_DRAWN = "not drawn"
#: "Not measured" on the page: the glyph every text output uses, never 0.
UNMEASURED = NOT_MEASURED

# Colours: a light and a dark theme chosen by the reader's system; figures use --fg for text and
# axes (their SVG says var(--fg)), and a palette readable on both (Okabe-Ito).
CSS = """
:root{--bg:#ffffff;--fg:#1d1f23;--muted:#5b6270;--rule:#d9dde3;--card:#f5f7fa;--bad:#b3261e;--good:#1b6e3a;
--warn:#8a5a00;color-scheme:light dark}
@media (prefers-color-scheme: dark){:root{--bg:#15171b;--fg:#e6e8eb;--muted:#a3aab5;--rule:#343a44;
--card:#1d2026;--bad:#ff8a80;--good:#7fd69a;--warn:#ffcc66}}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,
"Helvetica Neue",Arial,sans-serif}
header,main,footer{max-width:1280px;margin:0 auto;padding:0 20px}
h1{font-size:1.5em;margin:18px 0 6px}h2{font-size:1.2em;margin:0 0 10px}
.lead{font-size:1.05em;margin:4px 0 10px}
nav{font-size:.9em;color:var(--muted);padding-bottom:10px;border-bottom:1px solid var(--rule)}
nav a{color:inherit}
section{padding:16px 0;border-bottom:1px solid var(--rule)}
.pair{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}
.figs{flex:1 1 560px;min-width:0}.numbers{flex:1 1 340px;min-width:0}
.wide .figs,.wide .numbers{flex-basis:100%}.wide figure{max-width:960px}
.tw{overflow-x:auto;max-width:100%;margin:0 0 12px}.tw table{margin:0}
figure{margin:0 0 10px}figure svg{width:100%;height:auto;display:block}
table{border-collapse:collapse;font-size:.88em;margin:0 0 12px;width:100%}
caption{text-align:left;font-weight:600;padding:2px 0 4px}
th,td{padding:3px 6px;border-bottom:1px solid var(--rule);text-align:left;vertical-align:top}
th{color:var(--muted);font-weight:600}td.r,th.r{text-align:right;font-variant-numeric:tabular-nums}
.n{font-variant-numeric:tabular-nums;white-space:nowrap}
.reason,.note,small,footer{color:var(--muted)}
.absent h2{color:var(--muted)}
.pass{color:var(--good)}.fail,.misdiagnosis{color:var(--bad)}.warn{color:var(--warn)}
.supported{color:var(--good)}
ul{margin:4px 0 10px;padding-left:20px}li{margin:2px 0}
code{font-size:.92em}.id{white-space:nowrap}
footer{font-size:.85em;padding:12px 20px 24px}
"""

__all__ = ["CSS", "GENERATOR", "UNMEASURED", "Page", "Section", "esc", "num", "table"]
