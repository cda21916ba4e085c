"""``--html FILE``: one self-contained HTML page with the pictures a latency investigation needs.

The page opens offline in any browser: inline SVG drawn by matplotlib (the ``html`` extra,
imported only when a page is drawn), inline CSS for a light and a dark theme, no script, no
font or image fetched (its Content-Security-Policy forbids any). Every number on it is printed
from the document the same command's ``--json`` gives (``analyze``, ``report``, ``diff``, a
sweep's ``sweep.json``): nothing is computed twice. Figures of per-request and per-token data
read the analysis' tables, sampled or aggregated where a large trace cannot be drawn point by
point, and the page says where.

Public API::

    page = analysis_page(analysis, doc)            # analyzers.Analysis and its to_json() (+ "slo")
    page = report_page(analysis, report_doc)       # tracetool report's document, with its checks
    page = diff_page(diff_doc)                     # tracetool diff --json's document
    page = sweep_page(read_sweep("sweep-dir"))     # a probe sweep's summary
    written = write(page, "page.html", images=True)  # the page, and each figure as an SVG beside it
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracetool.errors import BadInput
from tracetool.report.html.figures import require
from tracetool.report.html.page import Page, Section, esc, num

#: The sweep summary a probe sweep writes into its output directory.
SWEEP_FILE = "sweep.json"


def analysis_page(a: Any, doc: dict[str, Any], *, title: str | None = None,
                  first: list[Section] | None = None) -> Page:
    """The page of one analysis (``doc`` is its ``to_json()``, with ``slo`` when SLOs were given)."""
    require()
    from tracetool.report.html import data, sections

    tokens = data.token_material(a, (doc["decode"]["fit"] or {}).get("basis") or _basis(doc),
                                 int(doc["decode"]["output_tokens"] or 0))
    body = [*(first or []), sections.verdict(doc), sections.waterfalls(a, doc),
            sections.distributions(a, doc, tokens), sections.decode(a, doc, tokens), sections.engine(a, doc)]
    traces = doc.get("traces") or []
    where = traces[0]["trace"] if len(traces) == 1 else f"{len(traces)} traces"
    failed = f", {doc['failed_requests']:,} failed" if doc["failed_requests"] else ""
    requests, tokens_n = f"{doc['requests']:,}", f"{doc['decode']['output_tokens'] or 0:,}"
    lead = (f"{esc(doc['headline'] or 'nothing measured')}<br><small>{esc(where)}: "
            f"{num(requests, 'requests')} requests{esc(failed)}, "
            f"{num(tokens_n, 'decode.output_tokens')} tokens</small>")
    return Page(title=title or f"tracetool: {where}", lead=lead, sections=body, kind="analysis",
                footer=_footer("tracetool analyze --json"))


def _basis(doc: dict[str, Any]) -> str | None:
    """The fit's basis when there is no fit: step times recorded (``host`` says so), else ITL."""
    host = doc.get("host") or {}
    return "step" if host.get("step_mean_ms") is not None else "itl"


def report_page(a: Any, doc: dict[str, Any], analysis_doc: dict[str, Any]) -> Page:
    """``tracetool report``'s page: the gate's checks first, then the analysis of the trace."""
    from tracetool.report.html.compare import checks

    page = analysis_page(a, analysis_doc, title=f"tracetool report: {doc['trace']['label']}",
                         first=[checks(doc)])
    s = doc["summary"]
    verdict = ("Passed" if doc["passed"] else "Failed") if s["checks"] else "No checks"
    page.lead = (f'<b class="{"pass" if doc["passed"] else "fail"}">{verdict}</b>: '
                 f"{num(str(s['checks']), 'summary.checks')} checks, {num(str(s['failed']), 'summary.failed')} "
                 f"failed. {page.lead}")
    page.kind = "report"
    page.footer = _footer("tracetool report --format json")
    return page


def diff_page(doc: dict[str, Any]) -> Page:
    """``tracetool diff``'s page: what moved, with intervals."""
    require()
    from tracetool.report.html.compare import diff

    a, b = doc["a"], doc["b"]
    lead = (f"{esc(doc['headline'])}<br><small>A {esc(a['label'])} ({num(str(a['requests']), 'a.requests')} "
            f"requests) → B {esc(b['label'])} ({num(str(b['requests']), 'b.requests')} requests)</small>")
    return Page(title=f"tracetool diff: {a['label']} → {b['label']}", lead=lead, sections=diff(doc), kind="diff",
                footer=_footer("tracetool diff --json"))


def sweep_page(doc: dict[str, Any], label: str = "sweep") -> Page:
    """A probe sweep's page, from its summary (``sweep.json``)."""
    require()
    from tracetool.report.html.compare import sweep

    levels = doc.get("levels") or []
    lead = esc(doc.get("moved") or f"{len(levels)} level{'s' if len(levels) != 1 else ''} of {doc.get('axis')}")
    return Page(title=f"tracetool sweep: {label}", lead=lead, sections=[sweep(doc)], kind="sweep",
                footer=_footer(f"the sweep's {SWEEP_FILE}"))


def _footer(source: str) -> str:
    return (f"Every number on this page is from {esc(source)}; figures of per-request and per-token data are "
            "drawn from the analysis' tables. Made by tracetool (docs/ci-reports.md).")


def read_sweep(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A sweep directory's summary, or None when ``path`` is not a sweep's output directory.

    Raises:
        BadInput: the summary is there but unreadable or not a sweep summary.
    """
    f = Path(path) / SWEEP_FILE
    if not f.is_file():
        return None
    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"{f}: not a readable sweep summary ({e})") from e
    if not isinstance(doc, dict) or doc.get("format") != "tracetool-sweep" or not isinstance(doc.get("levels"), list):
        raise BadInput(f"{f}: not a sweep summary (format tracetool-sweep)")
    return doc


@dataclass
class Written:
    """What :func:`write` wrote: the page and each figure's own SVG file (paths and sizes)."""

    page: Path
    bytes: int
    images: list[tuple[Path, str]] = field(default_factory=list)  # (path, the figure's title)


_TITLE = re.compile(r"<title>(.*?)</title>", re.S)


def write(page: Page, path: str | os.PathLike[str], images: bool = False) -> Written:
    """Write the page to ``path``; with ``images``, also each figure as ``<stem>-<n>.svg`` beside it
    (standalone: the page's colours inside, light and dark), for a Markdown report to show.

    Raises:
        BadInput: the file cannot be written (one line naming it).
    """
    out = Path(path)
    text = page.html()
    try:
        out.write_text(text, encoding="utf-8")
        written = Written(page=out, bytes=len(text.encode("utf-8")))
        if images:
            k = 0
            for s in page.sections:
                for fig in s.figures:
                    k += 1
                    f = out.with_name(f"{out.stem}-{k}-{s.id}.svg")
                    f.write_text(standalone(fig), encoding="utf-8")
                    m = _TITLE.search(fig)
                    written.images.append((f, _unescape(m.group(1)) if m else s.title))
    except OSError as e:
        raise BadInput(f"{out}: cannot write the page ({e.strerror or e})") from e
    return written


def _unescape(text: str) -> str:
    import html

    return html.unescape(text)


#: The page's colours for an SVG shown on its own (an <img> in a Markdown report).
_STANDALONE_STYLE = ("<style>svg{--fg:#1d1f23;--muted:#5b6270;--rule:#d9dde3}"
                     "@media (prefers-color-scheme: dark){svg{--fg:#e6e8eb;--muted:#a3aab5;--rule:#343a44}}</style>")


def standalone(svg: str) -> str:
    """An inline figure as an SVG file of its own: the XML prolog and the page's colour variables."""
    head = svg.index(">") + 1
    return '<?xml version="1.0" encoding="utf-8"?>\n' + svg[:head] + _STANDALONE_STYLE + svg[head:] + "\n"


__all__ = ["SWEEP_FILE", "Page", "Section", "Written", "analysis_page", "diff_page", "read_sweep", "report_page",
           "require", "standalone", "sweep_page", "write"]
