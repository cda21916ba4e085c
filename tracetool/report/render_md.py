"""The Markdown report: GitHub-flavoured, for ``$GITHUB_STEP_SUMMARY`` and PR comments.

Rendered from the JSON document (docs/ci-reports.md) alone, so the two never
disagree. Every table has a header, a delimiter row and the same number of
cells in each row; pipes in text are escaped. No timestamps, no paths.

Text that comes from the trace or the command line (labels, the headline, findings, claims,
check messages) is shown as :func:`tracetool.untrusted.shown` makes it, then escaped for
Markdown (:func:`md_text`, :func:`md_code`): the pages CI renders this on (a job summary, a PR
comment) must not get a link, an image, raw HTML or an entity from a trace, only its text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tracetool import units
from tracetool.glyphs import NOT_MEASURED
from tracetool.report import fmt
from tracetool.untrusted import NAME_LIMIT, TEXT_LIMIT, shown

STATUS_MARK = {"pass": "✅", "warn": "⚠️", "fail": "❌", "skip": "⚪"}
SEVERITY_MARK = {"warning": "⚠️", "info": "ℹ️"}
VERDICT_MARK = {"supported": "✅", "contributing": "➖", "misdiagnosis": "❌", "unmeasured": "❔"}


def render_markdown(doc: dict[str, Any]) -> str:
    """The whole report as Markdown text (ends with a newline); a probe sweep's (``doc["sweep"]``)
    is its per-level summary, not one analysis of every level's requests pooled."""
    if doc.get("sweep"):
        return _render_sweep(doc)
    out: list[str] = []
    t, b = doc["trace"], doc["baseline"]
    title = md_code(t["label"]) + (f" vs baseline {md_code(b['label'])}" if b else "")
    out.append(f"## {'✅' if doc['passed'] else '❌'} Latency report: {title}")
    out.append("")
    out.append(_verdict_line(doc))
    out.append("")
    if doc.get("headline"):
        out.append(f"> {md_text(doc['headline'])}")
        out.append("")
    if t.get("source"):
        out.append(f"Imported from {md_code(t['source'])}: client-side timings only; server phases are not measured "
                   "(shown as –, never as 0).")
        out.append("")
    out += _checks(doc)
    out += ["### Latency", ""]
    out += _latency_table(doc["latency"])
    out.append("")
    if doc["comparison"] is not None:
        s = doc["settings"]
        out += ["### Compared with the baseline", ""]
        conf = f"{s['confidence'] * 100:g} % CI"
        rows = []
        for c in doc["comparison"]:
            ci = (NOT_MEASURED if c["ci_low_pct"] is None
                  else f"{fmt.pct(c['ci_low_pct'])} … {fmt.pct(c['ci_high_pct'])}")
            p = NOT_MEASURED if c["mann_whitney_p"] is None else f"{c['mann_whitney_p']:.3f}"
            rows.append([fmt.stat_name(c["stat"], c["metric"]), fmt.ms(c["baseline_ms"]), fmt.ms(c["candidate_ms"]),
                         fmt.pct(c["delta_pct"]), ci, p, md_text(c["change"] or c["note"] or NOT_MEASURED)])
        out += table(["statistic", "baseline", "this run", "change", conf, "Mann-Whitney p", ""], rows, "lrrrlrl")
        out.append("")
        out.append(f"<sub>{conf}: percentile bootstrap, {s['bootstrap']:,} resamples (seed {s['seed']}), "
                   "requests resampled as units (a request's tokens stay together). Mann-Whitney: one-sided "
                   "p that this run is slower, per-request values (mean ITL per request).</sub>")
        out.append("")
    out += ["### Where the time went", ""]
    # measured per request, or filled in from the engine's metrics (a window mean, marked as such)
    measured = {k: c for k, c in doc["components"].items() if c["measured"] or c.get("basis")}
    unmeasured = [k for k, c in doc["components"].items() if not c["measured"] and not c.get("basis")]
    if measured:
        rows = [[name, fmt.ms(c["ms"]), fmt.share(c["share"]),
                 "◀ bottleneck" if name == doc.get("bottleneck")
                 else "engine metrics: a window mean, not per request" if c.get("basis") else ""]
                for name, c in measured.items()]
        out += table(["component", "mean per request", "share of e2e", ""], rows, "lrrl")
        out.append("")
    if unmeasured:
        out.append(f"Not measured (unknown, not zero): {', '.join(unmeasured)}.")
        out.append("")
    if doc.get("slo"):
        sl = doc["slo"]
        targets = ", ".join(f"{k} ≤ {v:g}" for k, v in sl["targets"].items())
        good = NOT_MEASURED if sl["goodput_rps"] is None else f"{sl['goodput_rps']:.2f} req/s"
        out += ["### SLOs", "", f"{targets}: {sl['met_requests']} of {sl['requests']} requests met them "
                f"({fmt.share(sl['attainment'])}); goodput {good}.", ""]
    if doc["findings"]:
        out += ["### Findings", ""]
        rows = [[SEVERITY_MARK.get(f["severity"], ""), f"**{md_text(f['title'])}** ({md_code(f['id'])})",
                 md_text(f["detail"])] for f in doc["findings"]]
        out += table(["", "finding", "evidence"], rows, "cll")
        out.append("")
    if doc["claims"]:
        out += ["### Claims", ""]
        rows = [[f"“{md_text(c['claim'])}”", f"{VERDICT_MARK.get(c['verdict'], '')} {md_text(c['verdict'])}",
                 fmt.share(c["share"]) + (f" of the {md_text(c['scope'])} tail's gap" if c.get("scope") else ""),
                 md_text(c["detail"])] for c in doc["claims"]]
        out += table(["claim", "verdict", "share of e2e", "evidence"], rows, "llrl")
        out.append("")
    return _end(doc, out)


def _checks(doc: dict[str, Any]) -> list[str]:
    if not doc["checks"]:
        return []
    rows = [[STATUS_MARK[c["status"]], md_text(c["title"]), check_value(c), md_text(c["message"])]
            for c in doc["checks"]]
    return ["### Checks", "", *table(["", "check", "measured", "detail"], rows, "clll"), ""]


def _end(doc: dict[str, Any], out: list[str]) -> str:
    if doc.get("html"):
        out += _pictures(doc["html"])
    out.append(f"<sub>{doc['format']} v{doc['version']} · `tracetool report --format json` has every number "
               "· docs/ci-reports.md</sub>")
    return "\n".join(out) + "\n"


# -- a probe sweep: its own summary (OUT/sweep.json), one row per level -------------------------

def _plain(text: str, key: str | None = None, scale: float = 1) -> str:
    return text


def sweep_header(axis: str) -> list[str]:
    """The per-level table's columns (the Markdown report's and the HTML page's)."""
    return [axis, "ok", "req/s", "tok/s", "TTFT p50", "TTFT p99", "ITL p50", "e2e p50", "e2e p99",
            "goodput req/s", "SLO met", "bottleneck"]


#: (metric, percentile) of the per-level table's latency columns.
SWEEP_LATENCY = (("ttft_ms", "p50"), ("ttft_ms", "p99"), ("itl_ms", "p50"), ("e2e_ms", "p50"), ("e2e_ms", "p99"))


def sweep_row(i: int, lv: dict[str, Any], num: Callable[..., str] = _plain,
              text: Callable[[Any], str] | None = None) -> list[str]:
    """One level's cells, each number formatted once for every format: ``num(shown, key, scale)``
    marks it (the HTML page's ``data-key``; plain text here), ``text`` escapes outside text
    (default: for Markdown)."""
    text = text or md_text
    k = f"levels.{i}"
    s = lv.get("slo") or {}
    return [num(f"{lv['level']:g}", f"{k}.level"),
            f"{num(str(lv['ok']), f'{k}.ok')}/{num(str(lv['requests']), f'{k}.requests')}",
            num(units.number(lv["request_throughput"], 2), f"{k}.request_throughput"),
            num(units.number(lv["output_token_throughput"], 1), f"{k}.output_token_throughput"),
            *(num(fmt.ms(lv[m][q]), f"{k}.{m}.{q}") for m, q in SWEEP_LATENCY),
            num(units.number(s.get("goodput_rps"), 2), f"{k}.slo.goodput_rps") if s else NOT_MEASURED,
            num(fmt.share(s.get("attainment")), f"{k}.slo.attainment", 100) if s else NOT_MEASURED,
            text(lv.get("bottleneck") or NOT_MEASURED)]


def sweep_notes(doc: dict[str, Any], num: Callable[..., str] = _plain,
                text: Callable[[Any], str] | None = None) -> list[str]:
    """The sentences under the per-level table: the SLOs and the highest level that meets them,
    where the time moved, the levels the client could not drive."""
    text = text or md_text
    levels = doc.get("levels") or []
    axis = doc.get("axis") or "level"
    targets: dict[str, float] = next((lv["slo"]["targets"] for lv in levels if lv.get("slo")), {})
    best = doc.get("best_level")
    out = []
    if targets:
        said = ", ".join(f"{text(k)} ≤ {v:g}" for k, v in targets.items())
        out.append(f"SLOs {said}: the highest {text(axis)} that meets them is "
                   f"{num(NOT_MEASURED if best is None else f'{best:g}', 'best_level')}"
                   f"{'' if best is not None else ' (none does)'}.")
    if doc.get("moved"):
        out.append(f"Where the time moved: {text(doc['moved'])}.")
    for lv in levels:
        if lv.get("client_bound"):
            out.append(f"{text(axis)} {lv['level']:g}: client-bound: {text(lv['client_bound'])}")
    return out


def _render_sweep(doc: dict[str, Any]) -> str:
    sw = doc["sweep"]
    levels = sw.get("levels") or []
    axis = sw.get("axis") or "level"
    said = ", ".join(f"{lv['level']:g}" for lv in levels)
    out = [f"## {'✅' if doc['passed'] else '❌'} Sweep report: {md_text(axis)} {said}", "",
           _verdict_line(doc).replace(" requests", " requests over every level", 1), ""]
    out += _checks(doc)
    out += ["### Per level", ""]
    if levels:
        out += table(sweep_header(md_text(axis)), [sweep_row(i, lv) for i, lv in enumerate(levels)],
                     "rrrrrrrrrrrl")
    else:
        out.append("The sweep has no level.")
    out.append("")
    for line in sweep_notes(sw):
        out += [line, ""]
    if len(levels) == 1:
        out += [ONE_LEVEL, ""]
    out.append("<sub>Each level's numbers are the sweep's own (`sweep.json`, written by `tracetool probe`); "
               "each level's trace is a trace of its own for `tracetool report LEVEL_DIR`.</sub>")
    out.append("")
    return _end(doc, out)


ONE_LEVEL = "One level: nothing to compare across levels (a sweep is --rate 1,2,4 or --concurrency 1,4,16)."


def _pictures(h: dict[str, Any]) -> list[str]:
    """The page and its figures (``report --html``): a link, then each figure as an image. Where a
    host shows no image from that address, the alt text says what the figure is."""
    out = ["### Pictures", "", f"The whole page, self-contained (opens offline): [{_link_text(h['page'])}]"
           f"({_url(h['page'])})", ""]
    for f in h["figures"]:
        out += [f"![{_alt(f['title'])}]({_url(f['path'])})", ""]
    return out


def _link_text(path: str) -> str:
    return path.rsplit("/", 1)[-1].replace("[", "").replace("]", "")


def _alt(text: str) -> str:
    return " ".join(text.split()).replace("[", "(").replace("]", ")")


def _url(path: str) -> str:
    """A link target Markdown keeps whole: spaces and parentheses escaped."""
    return path.replace(" ", "%20").replace("(", "%28").replace(")", "%29")


def _verdict_line(doc: dict[str, Any]) -> str:
    s, t, b = doc["summary"], doc["trace"], doc["baseline"]
    if s["checks"]:
        parts = [f"{s['passed']} passed"]
        parts += [f"{s[k]} {k}" for k in ("warned", "failed", "skipped") if s[k]]
        verdict = f"**{'Passed' if doc['passed'] else 'Failed'}**: {s['checks']} checks, {', '.join(parts)}"
    else:
        verdict = "**No checks** (no baseline and no budget)"
    runs = f"{_requests(t)}" + (f" · baseline {_requests(b)}" if b else "")
    budget = doc["settings"]["budget"]
    tail = f" · budget {md_code(budget)}" if budget else ""
    return f"{verdict} · {runs}{tail}"


def _requests(r: dict[str, Any]) -> str:
    failed = f" ({r['failed_requests']} failed)" if r["failed_requests"] else ""
    return f"{r['requests']} requests{failed}"


def check_value(c: dict[str, Any]) -> str:
    """A check's measured value as the Markdown and the HTML page show it."""
    if c["value"] is None:
        return NOT_MEASURED
    if c["unit"] == "pct":
        return f"{fmt.pct(c['value'])} ({fmt.pct(c['ci_low'])} … {fmt.pct(c['ci_high'])})"
    if c["unit"] == "ms":
        return fmt.ms(c["value"])
    if c["unit"] == "rps":
        return f"{c['value']:.2f} req/s"
    return fmt.share(c["value"])


def _latency_table(lat: dict[str, Any]) -> list[str]:
    rows = []
    for m, p in lat.items():
        rows.append([fmt.METRIC_NAMES[m], p["clock"] or NOT_MEASURED, f"{p['n']:,}",
                     *(fmt.ms(p[k]) for k in ("mean", "p50", "p90", "p95", "p99"))])
    return table(["metric", "clock", "n", "mean", "p50", "p90", "p95", "p99"], rows, "llrrrrrr")


def table(header: list[str], rows: list[list[str]], align: str) -> list[str]:
    """A GitHub-flavoured table; ``align`` has one of ``l``, ``r``, ``c`` per column."""
    delim = {"l": "---", "r": "---:", "c": ":---:"}
    lines = [_row(header), "|" + "|".join(delim[a] for a in align) + "|"]
    lines += [_row(r) for r in rows]
    return lines


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _cell(text: str) -> str:
    # a pipe splits a GFM table cell even inside a code span: escaped here, for every cell
    return " ".join(str(text).split()).replace("|", "\\|")


#: Markdown's inline syntax: links and images ([ ]), raw HTML and autolinks (< >), entities (&),
#: code (`), emphasis and strikethrough (* ~, and _ where it does not stand inside a word: GFM
#: never reads an intraword underscore as emphasis, so ``p95_ttft_ms`` stays as written), and the
#: backslash itself; # and > only where a block would start (the first character).
_MD_INLINE = re.compile(r"[\\`*~\[\]<>&]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])|^[#>]")


def md_text(text: object, limit: int = TEXT_LIMIT) -> str:
    """Outside text as Markdown shows it: :func:`~tracetool.untrusted.shown`, on one line, with
    every character Markdown would act on backslash-escaped (pipes: see :func:`table`)."""
    return _MD_INLINE.sub(lambda m: "\\" + m.group(), " ".join(shown(text, limit).split()))


def md_code(text: object, limit: int = NAME_LIMIT) -> str:
    """Outside text as a Markdown code span: fenced by more backticks than it holds in a row
    (a backtick inside cannot end the span), padded where it starts or ends with one."""
    s = " ".join(shown(text, limit).split())
    fence = "`" * (max((len(run) for run in re.findall("`+", s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


__all__ = ["ONE_LEVEL", "SWEEP_LATENCY", "check_value", "md_code", "md_text", "render_markdown",
           "sweep_header", "sweep_notes", "sweep_row", "table"]
