"""The analysis page's figures: each takes plain data (:mod:`tracetool.report.html.data` and the
analysis document) and returns one inline SVG (:func:`tracetool.report.html.figures.svg`).

Nothing here computes a reported number: lines and markers are drawn where the analysis put
them (percentiles, the fit, the roofline), and what was not measured is written as such in the
figure, never drawn as a zero.
"""

from __future__ import annotations

import math
from typing import Any

from tracetool.report.html.data import Curve, EngineSeries, Lane
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

#: The percentiles marked on every distribution (keys of the analysis' latency objects).
MARKS = ("p50", "p90", "p95", "p99")


def components(rows: list[dict[str, Any]]) -> str:
    """Share of e2e per component, one bar each. ``rows``: ``name``, ``share``, ``label`` (the
    text beside the bar) and ``state``: ``measured``, ``engine`` (filled in from the engine's
    metrics: hatched) or ``unmeasured`` (no bar, the words instead)."""
    with figure(0.32 * len(rows) + 0.7) as (fig, ax):
        ys = list(range(len(rows)))[::-1]
        top = max([r["share"] or 0 for r in rows] + [0.01]) * 100
        for y, r in zip(ys, rows, strict=True):
            colour = COMPONENT_COLOURS.get(r["name"], MUTED)
            if r["state"] == "unmeasured":
                ax.text(0, y, "  " + r["label"], va="center", ha="left", color=MUTED, fontsize=8.5)
                continue
            share = (r["share"] or 0) * 100
            ax.barh(y, share, color=colour if r["state"] == "measured" else "none", edgecolor=colour,
                    hatch=None if r["state"] == "measured" else "////", height=0.65)
            ax.text(share + top * 0.01, y, " " + r["label"], va="center", ha="left", fontsize=8.5)
        ax.set_yticks(ys, [r["name"] for r in rows])
        ax.set_xlim(0, top * 1.45)
        ax.set_xticks([t for t in ax.get_xticks() if 0 <= t <= 100])  # room for the labels, never a share > 100 %
        ax.set_xlabel("share of summed e2e (%)")
        ax.grid(axis="y", visible=False)
        return svg(fig, "components", "Where the time went: each component's share of e2e")


def waterfalls(lanes: list[Lane], clipped: bool) -> str:
    """One row per request, on its own timeline from its start: the client's request (outline),
    the server's span (inner outline), each phase as a bar in its component's colour, tokens as
    ticks under it."""
    from matplotlib.patches import Patch

    rows = len(lanes) + (1 if any(la.group == "typical" for la in lanes) else 0)
    with figure(0.34 * rows + 1.0) as (fig, ax):
        y, labels, ys = 0.0, [], []
        tick_x: list[float] = []
        tick_y: list[float] = []
        seen: dict[str, bool] = {}
        group = None
        for la in lanes:
            if group is not None and la.group != group:
                y += 1.0  # a gap between the slowest and the typical ones
            group = la.group
            for name, lo, hi in la.outline:
                h = {"client.queue": 0.86, "client.request": 0.86, "server.request": 0.66}[name]
                ax.add_patch(_rect(lo, y - h / 2, hi - lo, h, MUTED, dashed=name == "client.queue"))
            by_comp: dict[str, list[tuple[float, float]]] = {}
            for comp, lo, hi in la.phases:
                by_comp.setdefault(comp, []).append((lo, max(hi - lo, 0.0)))
            for comp, spans in by_comp.items():
                ax.broken_barh(spans, (y - 0.22, 0.44), facecolors=COMPONENT_COLOURS.get(comp, MUTED))
                seen[comp] = True
            for t in la.ticks:
                tick_x += [t, t, math.nan]
                tick_y += [y + 0.26, y + 0.4, math.nan]
            labels.append(f"{_short(la.request_id)} · {la.group}")
            ys.append(y)
            y += 1.0
        if tick_x:
            ax.plot(tick_x, tick_y, color=MUTED, linewidth=0.6)
        ax.set_yticks(ys, labels)
        ax.invert_yaxis()
        ax.set_xlim(left=0)
        ax.set_xlabel("ms from the request's start (server spans placed by the symmetric-delay assumption)")
        handles = [Patch(facecolor=COMPONENT_COLOURS[c], label=c) for c in COMPONENT_COLOURS if c in seen]
        handles.append(Patch(facecolor="none", edgecolor=MUTED, label="request (client, server)"))
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.2 / max(rows, 1)),
                  ncol=min(len(handles), 5))
        ax.grid(axis="y", visible=False)
        ax.autoscale_view()
        title = "Request waterfalls: the slowest requests and a spread of the others"
        if clipped:
            title += " (token ticks thinned)"
        return svg(fig, "waterfalls", title)


def _rect(x: float, y: float, w: float, h: float, colour: str, dashed: bool = False) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), max(w, 0.0), h, fill=False, edgecolor=colour, linewidth=0.8,
                     linestyle="--" if dashed else "-")


def _short(text: str, n: int = 22) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def distributions(curves: dict[str, Curve | None], marks: dict[str, dict[str, Any]],
                  slo: dict[str, float]) -> str:
    """TTFT, ITL, TPOT and e2e as cumulative curves, the analysis' percentiles marked on each and
    an SLO line where one is given. ``marks`` are the analysis' ``*_ms`` objects."""
    names = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2e": "e2e"}
    with figure(5.2, ncols=2, nrows=2) as (fig, axes):
        for ax, key in zip(axes.flat, names, strict=True):
            c = curves.get(key)
            ax.set_title(names[key])
            if c is None or not c.x:
                no_data(ax, f"{names[key]}: not measured")
                continue
            ax.plot(c.x, [p * 100 for p in c.p], color=LINE, drawstyle="steps-post" if c.exact else "default",
                    linewidth=1.3)
            m = marks.get(key) or {}
            for q in MARKS:
                v = m.get(q)
                if v is None:
                    continue
                ax.axvline(v, color=MUTED, linewidth=0.7, linestyle=":")
                ax.annotate(q, (v, float(q[1:])), xytext=(2, 0), textcoords="offset points", fontsize=7,
                            va="center")
                ax.plot([v], [float(q[1:])], marker="o", markersize=3, color=LINE)
            target = slo.get(f"{key}_ms")
            if target is not None:
                ax.axvline(target, color=ACCENT, linewidth=1.2, linestyle="--")
                ax.annotate(f"SLO {target:g} ms", (target, 8), xytext=(3, 0), textcoords="offset points",
                            color=ACCENT, fontsize=7.5)
            positive = [x for x in c.x if x > 0]
            if positive and max(positive) / min(positive) > 200:
                ax.set_xscale("log")
            ax.set_ylim(0, 102)
            ax.set_xlabel("ms")
            ax.set_ylabel("% at or below")
        return svg(fig, "distributions", "Latency distributions: TTFT, ITL, TPOT and e2e")


def decode(points: list[tuple[float, float]], basis: str, fit: dict[str, Any] | None,
           roofline: dict[str, Any] | None) -> str:
    """Per-token time against KV length: a sample of the tokens, the analysis' fit over all of
    them, and the roofline's ideal step where the model and GPU are known."""
    ylabel = {"step": "forward-pass time (ms)", "itl": "server-side ITL (ms)"}.get(basis, "ms")
    with figure(3.4) as (fig, ax):
        if points:
            ax.scatter([p[0] for p in points], [p[1] for p in points], s=4, alpha=0.35, color=LINE,
                       linewidths=0, label="tokens (sample)")
        lo, hi = _kv_range(points, fit)
        if fit is not None and lo is not None and hi is not None:
            ax.plot([lo, hi], [fit["base_ms"] + fit["per_1k_kv_ms"] * lo / 1000,
                               fit["base_ms"] + fit["per_1k_kv_ms"] * hi / 1000], color=ACCENT, linewidth=1.6,
                    label="fit (all tokens)")
        _roofline_line(ax, roofline, lo, hi)
        ax.set_xlabel("KV length (tokens)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left")
        return svg(fig, "decode", f"Decode: {ylabel} against KV length")


def batched(points: list[tuple[float, float, int]], by_batch: list[dict[str, Any]], fit: dict[str, Any] | None,
            roofline: dict[str, Any] | None) -> str:
    """Under batching: decode-only step time against the step's summed KV tokens (colour: batch
    size) with the fit at a few batch sizes, and mean decode-only step time per batch size
    (``steps_batch.decode_only_mean_step_ms``)."""
    with figure(3.4, ncols=2, gridspec_kw={"width_ratios": [3, 2]}) as (fig, (ax, bx)):
        # one colour per batch-size group, named in the legend (a colour bar would be a raster image)
        for (lo_b, hi_b), colour in zip(_batch_groups(sorted({p[2] for p in points})), _GROUP_COLOURS, strict=False):
            group = [p for p in points if lo_b <= p[2] <= hi_b]
            ax.scatter([p[0] for p in group], [p[1] for p in group], s=5, alpha=0.55, color=colour, linewidths=0,
                       label=f"batch {lo_b}" if lo_b == hi_b else f"batch {lo_b}–{hi_b}")
        lo, hi = _kv_range([(p[0], p[1]) for p in points], fit)
        if fit is not None and lo is not None and hi is not None and points:
            sizes = sorted({p[2] for p in points})
            for b in sorted({sizes[0], sizes[len(sizes) // 2], sizes[-1]}):
                seq = (fit.get("per_seq_ms") or 0) * b
                ax.plot([lo, hi], [fit["base_ms"] + seq + fit["per_1k_kv_ms"] * lo / 1000,
                                   fit["base_ms"] + seq + fit["per_1k_kv_ms"] * hi / 1000], linewidth=1.2,
                        color=ACCENT, alpha=0.5 + 0.5 * (b == sizes[-1]))
                ax.annotate(f"fit, batch {b}", (hi, fit["base_ms"] + seq + fit["per_1k_kv_ms"] * hi / 1000),
                            fontsize=7, ha="right", va="bottom", color=ACCENT, xytext=(0, 2 + 9 * (b != sizes[-1])),
                            textcoords="offset points")
        _roofline_line(ax, roofline, lo, hi)
        if points:  # after every labelled line: the roofline's dashed line is named in it too
            ax.legend(loc="upper left", markerscale=2)
        ax.set_xlabel("KV tokens summed over the batch")
        ax.set_ylabel("decode-only step (ms)")
        ax.set_ylim(bottom=0)
        # decode-only, as the scatter beside it: a batch's iterations that also prefill are stretched by
        # the prompt (a lone request's prefill step made batch 1 read 3x its decode steps)
        mean = [(r["batch_size"], r["decode_only_mean_step_ms"]) for r in by_batch
                if r["batch_size"] is not None and r["decode_only_mean_step_ms"] is not None]
        if mean:
            bx.plot([b for b, _ in mean], [m for _, m in mean], marker="o", markersize=3, color=SECOND)
            bx.set_xlabel("batch size")
            bx.set_ylabel("mean decode-only step (ms)")
            bx.set_ylim(bottom=0)
        else:
            no_data(bx, "no decode-only steps per batch size")
        return svg(fig, "batched", "Decode under batching: step time against summed KV and batch size")


_GROUP_COLOURS = ("#0072b2", "#009e73", "#e69f00", "#cc79a7", "#d55e00", "#56b4e9")


def _batch_groups(sizes: list[int]) -> list[tuple[int, int]]:
    """Batch sizes in at most six groups of neighbouring sizes (each size alone when few)."""
    if len(sizes) <= len(_GROUP_COLOURS):
        return [(b, b) for b in sizes]
    k = len(_GROUP_COLOURS)
    cuts = [sizes[round(i * (len(sizes) - 1) / k)] for i in range(k + 1)]
    out, lo = [], sizes[0]
    for c in cuts[1:]:
        members = [b for b in sizes if lo <= b <= c]
        if members:
            out.append((members[0], members[-1]))
            lo = members[-1] + 1
    return out


def _kv_range(points: list[tuple[float, float]], fit: dict[str, Any] | None) -> tuple[float | None, float | None]:
    if fit is not None and fit.get("kv_len_min") is not None:
        return float(fit["kv_len_min"]), float(fit["kv_len_max"])
    if points:
        return points[0][0], points[-1][0]
    return None, None


def _roofline_line(ax: Any, roofline: dict[str, Any] | None, lo: float | None, hi: float | None) -> None:
    if not roofline or lo is None or hi is None or roofline.get("ideal_base_ms") is None:
        return
    b, k = roofline["ideal_base_ms"], roofline.get("ideal_per_1k_kv_ms") or 0.0
    ax.plot([lo, hi], [b + k * lo / 1000, b + k * hi / 1000], color=SECOND, linewidth=1.4, linestyle="--",
            label="roofline ideal")


def engine(e: EngineSeries) -> str:
    """The engine's state over the window, with the requests that arrived and their TTFT below."""
    rows = [("requests", True), ("KV-cache use (%)", any(v is not None for v in e.kv)),
            ("preemptions since start", any(v is not None for v in e.preempted)), ("TTFT (ms)", True)]
    shown = [r for r in rows if r[1]]
    with figure(1.25 * len(shown) + 0.6, nrows=len(shown), sharex=True) as (fig, axes):
        axes = list(axes) if len(shown) > 1 else [axes]
        for ax, (name, _) in zip(axes, shown, strict=True):
            if name == "requests":
                if any(v is not None for v in e.waiting):
                    ax.step(e.t, _nan(e.waiting), where="post", color=ACCENT, label="waiting (queue)")
                if any(v is not None for v in e.running):
                    ax.step(e.t, _nan(e.running), where="post", color=LINE, label="running")
                ax.legend(loc="upper right")
                ax.set_ylabel("requests")
                ax.set_ylim(bottom=0)
            elif name.startswith("KV"):
                ax.step(e.t, _nan(e.kv), where="post", color=SECOND)
                ax.set_ylabel("KV use %")
                ax.set_ylim(0, 105)
            elif name.startswith("preemptions"):
                ax.step(e.t, _nan(e.preempted), where="post", color="#cc79a7")
                ax.set_ylabel("preempted")
                ax.set_ylim(bottom=0)
            else:
                if e.ttft:
                    ax.scatter([t for t, _ in e.ttft], [v for _, v in e.ttft], s=6, color=LINE, linewidths=0,
                               label="TTFT at arrival")
                # arrivals as ticks along the bottom edge, whatever the TTFT scale
                ax.plot(e.arrivals, [0.04] * len(e.arrivals), "|", color=MUTED, markersize=8, label="arrivals",
                        transform=ax.get_xaxis_transform())
                ax.set_ylabel("TTFT (ms)")
                ax.legend(loc="upper right")
        axes[-1].set_xlabel(f"s from the window's start ({e.clock} clock)")
        axes[-1].set_xlim(0, max(e.window_s, 1e-3))
        return svg(fig, "engine", "Engine state over time, with request arrivals and TTFT")


def _nan(values: list[float | None]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


__all__ = ["MARKS", "batched", "components", "decode", "distributions", "engine", "waterfalls"]
