"""Pages that compare runs: a probe sweep (its summary, ``OUT/sweep.json``), a diff of two runs
(``diff --json``'s document) and the CI report's checks (``report --format json``'s). Each number
is printed from that document, marked with its key in it (``data-key``)."""

from __future__ import annotations

import math
from typing import Any

from tracetool.glyphs import NOT_MEASURED
from tracetool.report import fmt
from tracetool.report.html.figures import (
    ACCENT,
    COMPONENT_COLOURS,
    LINE,
    MUTED,
    SECOND,
    figure,
    no_data,
    svg,
)
from tracetool.report.html.page import Section, esc, num, table
from tracetool.report.html.sections import n
from tracetool.report.render_md import ONE_LEVEL, STATUS_MARK, check_value, sweep_header, sweep_notes, sweep_row

SWEEP_METRICS = (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "e2e"))
QS = ("p50", "p90", "p99")


# -- a sweep ---------------------------------------------------------------------------------

def sweep(doc: dict[str, Any]) -> Section:
    title = "Sweep: latency against throughput"
    levels = doc.get("levels") or []
    if not levels:
        return Section.absent("sweep", title, "the sweep has no level")
    axis = doc.get("axis") or "level"
    targets: dict[str, float] = next((lv["slo"]["targets"] for lv in levels if lv.get("slo")), {})
    best = doc.get("best_level")
    # the cells and sentences the Markdown report writes too (one formatter per number), marked here
    rows = [sweep_row(i, lv, num=n, text=esc) for i, lv in enumerate(levels)]
    body = table(sweep_header(axis), rows, "rrrrrrrrrrrl", caption="Per level")
    body += "".join(f"<p>{line}</p>" for line in sweep_notes(doc, num=n, text=esc))
    note = ONE_LEVEL if len(levels) == 1 else None
    # twelve columns do not fit beside the figures: the table goes under them, full width
    return Section(id="sweep", title=title, body=body, figures=[_sweep_latency(levels, targets, best),
                                                                _sweep_shares(levels, axis)], note=note, wide=True)


def _sweep_latency(levels: list[dict[str, Any]], targets: dict[str, float], best: float | None) -> str:
    with figure(3.3, ncols=3) as (fig, axes):
        x = [lv["request_throughput"] for lv in levels]
        for ax, (m, name) in zip(axes, SWEEP_METRICS, strict=True):
            ax.set_title(name)
            drew = False
            for q, style in zip(QS, ("-", "--", ":"), strict=True):
                pts = [(xi, lv[m][q]) for xi, lv in zip(x, levels, strict=True)
                       if xi is not None and lv[m][q] is not None]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", markersize=3, color=LINE,
                            label=q)
                    drew = True
            if not drew:
                no_data(ax, f"{name}: not measured")
                continue
            for xi, lv in zip(x, levels, strict=True):
                if xi is not None and lv[m]["p50"] is not None:
                    ax.annotate(f"{lv['level']:g}", (xi, lv[m]["p50"]), xytext=(3, -9), textcoords="offset points",
                                fontsize=7, color=MUTED)
                    if best is not None and lv["level"] == best:
                        ax.plot([xi], [lv[m]["p99"] or lv[m]["p50"]], "o", markersize=9, markerfacecolor="none",
                                color=SECOND)
            if m in targets:
                ax.axhline(targets[m], color=ACCENT, linestyle="--", linewidth=1.2)
                ax.annotate(f"SLO {targets[m]:g} ms", (0.02, targets[m]), xycoords=("axes fraction", "data"),
                            xytext=(0, 2), textcoords="offset points", color=ACCENT, fontsize=7.5)
            ax.set_xlabel("requests/s")
            ax.set_ylabel("ms")
            ax.set_ylim(bottom=0)
            ax.legend(loc="upper left")
        return svg(fig, "sweep-latency", "Latency percentiles against throughput, per level")


def _sweep_shares(levels: list[dict[str, Any]], axis: str) -> str:
    comps = list(dict.fromkeys(k for lv in levels for k in lv.get("shares") or {}))
    good = [lv.get("slo", {}) and lv["slo"].get("goodput_rps") for lv in levels]
    with figure(2.8, ncols=2) as (fig, (ax, gx)):
        names = [f"{lv['level']:g}" for lv in levels]
        if comps:
            bottom = [0.0] * len(levels)
            for c in comps:
                vals = [((lv.get("shares") or {}).get(c) or 0) * 100 for lv in levels]
                ax.bar(names, vals, bottom=bottom, color=COMPONENT_COLOURS.get(c, MUTED), label=c)
                bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
            ax.set_ylabel("share of e2e (%)")
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        else:
            no_data(ax, "where the time went: not measured")
        ax.set_xlabel(axis)
        ax.set_title("Where the time went")
        if any(g is not None and g is not False for g in good):
            gx.bar(names, [g or 0 for g in good], color=SECOND)
            gx.set_ylabel("goodput (req/s meeting the SLOs)")
        else:
            no_data(gx, "goodput: no SLOs given (--slo)")
        gx.set_xlabel(axis)
        gx.set_title("Goodput")
        return svg(fig, "sweep-shares", "Where the time went and goodput, per level")


# -- a diff ----------------------------------------------------------------------------------

def diff(doc: dict[str, Any]) -> list[Section]:
    """The components' changes (the moved one first) and the latency changes, each with its interval."""
    conf = f"{doc['settings']['confidence'] * 100:g} %"
    comps = list(enumerate(doc["components"]))
    order = sorted(comps, key=lambda ic: (ic[1]["component"] != doc.get("top"),
                                          -abs(ic[1]["delta_ms"]) if ic[1]["delta_ms"] is not None else math.inf))
    rows = []
    for i, c in order:
        k = f"components.{i}"
        ci = (NOT_MEASURED if c["ci_low_ms"] is None
              else f"{num(fmt.ms(c['ci_low_ms'], sign=True), f'{k}.ci_low_ms')} … "
                   f"{num(fmt.ms(c['ci_high_ms'], sign=True), f'{k}.ci_high_ms')}")
        rows.append([esc(c["component"]) + (" ◀ moved most" if c["component"] == doc.get("top") else ""),
                     n(fmt.ms(c["a_ms"]), f"{k}.a_ms"), n(fmt.ms(c["b_ms"]), f"{k}.b_ms"),
                     n(fmt.ms(c["delta_ms"], sign=True), f"{k}.delta_ms"), ci,
                     f"{n(fmt.share(c['a_share']), f'{k}.a_share', 100)} → "
                     f"{n(fmt.share(c['b_share']), f'{k}.b_share', 100)}"])
    body = table(["component", "A per request", "B per request", "change", f"{conf} interval", "share A → B"],
                 rows, "lrrrll", caption="Components (ms per request)")
    if not comps:
        first = Section.absent("diff", "What moved", "no component is measured in either trace")
    else:
        first = Section(id="diff", title="What moved", body=body, figures=[_diff_components([c for _, c in order])])
    lrows = []
    for i, x in enumerate(doc["latency"]):
        k = f"latency.{i}"
        ci = NOT_MEASURED if x["ci_low_pct"] is None else (f"{n(fmt.pct(x['ci_low_pct']), f'{k}.ci_low_pct')} … "
                                                            f"{n(fmt.pct(x['ci_high_pct']), f'{k}.ci_high_pct')}")
        lrows.append([esc(fmt.stat_name(x["stat"], x["metric"])), n(fmt.ms(x["a_ms"]), f"{k}.a_ms"),
                      n(fmt.ms(x["b_ms"]), f"{k}.b_ms"), n(fmt.pct(x["delta_pct"]), f"{k}.delta_pct"), ci,
                      "significant" if x["significant"] else esc(x["note"] or "")])
    lbody = table(["statistic", "A", "B", "change", f"{conf} interval", ""], lrows, "lrrrll",
                  caption="Latency (bootstrap, requests resampled as units)")
    second = Section(id="diff-latency", title="Latency change", body=lbody, figures=[_diff_latency(doc["latency"])])
    return [first, second]


def _diff_components(comps: list[dict[str, Any]]) -> str:
    with figure(0.36 * len(comps) + 0.9) as (fig, ax):
        ys = list(range(len(comps)))[::-1]
        for y, c in zip(ys, comps, strict=True):
            if c["delta_ms"] is None:
                ax.text(0, y, " not measured in both", va="center", color=MUTED, fontsize=8)
                continue
            err = None
            if c["ci_low_ms"] is not None:
                err = [[c["delta_ms"] - c["ci_low_ms"]], [c["ci_high_ms"] - c["delta_ms"]]]
            ax.barh(y, c["delta_ms"], color=COMPONENT_COLOURS.get(c["component"], MUTED), height=0.6,
                    xerr=err, error_kw={"ecolor": MUTED, "capsize": 3, "linewidth": 0.9})
        ax.axvline(0, color=MUTED, linewidth=0.8)
        ax.set_yticks(ys, [c["component"] for c in comps])
        ax.set_xlabel("change in ms per request, B − A (bar), with its interval")
        ax.grid(axis="y", visible=False)
        return svg(fig, "diff-components", "Each component's change with its interval, the moved one first")


def _diff_latency(lat: list[dict[str, Any]]) -> str:
    with figure(0.3 * max(len(lat), 1) + 0.9) as (fig, ax):
        if not lat:
            no_data(ax, "no latency figure in both traces")
        ys = list(range(len(lat)))[::-1]
        for y, x in zip(ys, lat, strict=True):
            if x["delta_pct"] is None:
                ax.text(0, y, " not measured in both", va="center", color=MUTED, fontsize=8)
                continue
            err = None
            if x["ci_low_pct"] is not None:
                err = [[x["delta_pct"] - x["ci_low_pct"]], [x["ci_high_pct"] - x["delta_pct"]]]
            ax.errorbar([x["delta_pct"]], [y], xerr=err, fmt="o", color=ACCENT if x["significant"] else LINE,
                        ecolor=MUTED, capsize=3, markersize=4)
        ax.axvline(0, color=MUTED, linewidth=0.8)
        ax.set_yticks(ys, [fmt.stat_name(x["stat"], x["metric"]) for x in lat])
        ax.set_xlabel("change, % (B over A), with its interval")
        ax.grid(axis="y", visible=False)
        return svg(fig, "diff-latency", "Latency change per statistic with its interval")


# -- the CI report's gate ---------------------------------------------------------------------

def checks(doc: dict[str, Any]) -> Section:
    title = "Checks"
    if not doc["checks"]:
        return Section.absent("checks", title, "no checks: no baseline and no budget")
    rows = [[f'<span class="{esc(c["status"])}">{STATUS_MARK[c["status"]]} {esc(c["status"])}</span>',
             esc(c["title"]), num(check_value(c), f"checks.{i}.value"), esc(c["message"])]
            for i, c in enumerate(doc["checks"])]
    body = table(["", "check", "measured", "detail"], rows, "llrl")
    if doc.get("comparison"):
        crow = [[esc(fmt.stat_name(c["stat"], c["metric"])), n(fmt.ms(c["baseline_ms"]), f"comparison.{i}.baseline_ms"),
                 n(fmt.ms(c["candidate_ms"]), f"comparison.{i}.candidate_ms"),
                 n(fmt.pct(c["delta_pct"]), f"comparison.{i}.delta_pct"), esc(c["change"] or c["note"] or "")]
                for i, c in enumerate(doc["comparison"])]
        body += table(["statistic", "baseline", "this run", "change", ""], crow, "lrrrl",
                      caption="Compared with the baseline")
    return Section(id="checks", title=title, body=body)


__all__ = ["checks", "diff", "sweep"]
