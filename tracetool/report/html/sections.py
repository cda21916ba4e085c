"""The analysis page's sections: verdict and components, waterfalls, distributions, decode, engine.

Each section prints its numbers from the analysis document (``analyze --json``), each marked
with its key in that document (``data-key``), beside the figure that draws them; a section
without data is kept, with the reason it is not drawn.
"""

from __future__ import annotations

from typing import Any

from tracetool import units
from tracetool.glyphs import NOT_MEASURED, bucketed_percentiles
from tracetool.report import fmt
from tracetool.report.html import data, plots
from tracetool.report.html.page import Section, esc, num, table
from tracetool.schema import shown_components

ENGINE_BASIS = "engine-metrics"
METRICS = ("e2e", "ttft", "itl", "tpot")


def n(text: str, key: str | None, scale: float = 1) -> str:
    """A number with its key; ``scale`` is what the document's value is multiplied by to give the
    shown one (100 for a share shown in %)."""
    html = num(text, key)
    if scale != 1 and key is not None:
        html = html.replace(' data-key=', f' data-scale="{scale:g}" data-key=', 1)
    return html




# -- 1. verdict -------------------------------------------------------------------------------

def verdict(doc: dict[str, Any]) -> Section:
    comps: dict[str, dict[str, Any]] = shown_components(doc["components"])
    ne = doc.get("network_evidence") or {}
    rows, fig_rows = [], []
    for name, c in comps.items():
        key = f"components.{name}"
        if c.get("basis") == ENGINE_BASIS:
            state, note = "engine", "engine metrics: a window mean, not per request"
        elif c["measured"]:
            state, note = "measured", "◀ bottleneck" if name == doc.get("bottleneck") else ""
        else:
            state, note = "unmeasured", "not measured (unknown, not zero)"
        if name == "network" and state == "unmeasured" and ne.get("basis") == "unsplit":
            note = (f"not split from the server's frontend: network + frontend "
                    f"{fmt.ms(ne.get('outside_ms'))} per request, no round trip measured to split them")
        rows.append([esc(name), n(fmt.ms(c["ms"]), f"{key}.ms"), n(fmt.share(c["share"]), f"{key}.share", 100),
                     esc(note)])
        label = (f"{fmt.share(c['share'])} · {fmt.ms(c['ms'])} per request" if state != "unmeasured"
                 else ("not split (network + frontend)" if "not split" in note else "not measured"))
        fig_rows.append({"name": name, "share": c["share"], "state": state, "label": label})
    body = table(["component", "mean per request", "share of e2e", ""], rows, "lrrl",
                 caption="Where the time went (mean per request; share of summed e2e)")
    if doc["claims"]:
        crow = [[f"“{esc(c['claim'])}”", f'<span class="{esc(c["verdict"])}">{esc(c["verdict"])}</span>',
                 n(fmt.share(c["share"]), f"claims.{i}.share", 100), esc(c["detail"])]
                for i, c in enumerate(doc["claims"])]
        body += table(["claim", "verdict", "share", "evidence"], crow, "llrl", caption="Claims")
    if doc["findings"]:
        items = "".join(f"<li><b>{esc(f['title'])}</b> <code>{esc(f['id'])}</code>: {esc(f['detail'])}</li>"
                        for f in doc["findings"])
        body += f"<p><b>Findings</b></p><ul>{items}</ul>"
    return Section(id="verdict", title="Verdict and where the time went", body=body,
                   figures=[plots.components(fig_rows)])


# -- 2. waterfalls -----------------------------------------------------------------------------

def waterfalls(a: Any, doc: dict[str, Any]) -> Section:
    title = "Request waterfalls"
    lanes = data.lanes(a)
    if not lanes:
        return Section.absent("waterfalls", title, "no successful request has an e2e to lay out")
    req = {(r["trace"], r["request_id"]): r for r in a.rows("attribution_requests")}
    rows = []
    for la in lanes:
        r = req.get((la.trace, la.request_id), {})
        short = la.request_id if len(la.request_id) <= 18 else la.request_id[:17] + "…"
        rows.append([f'<span class="id" title="{esc(la.request_id)}">{esc(short)}</span>', esc(la.group),
                     num(fmt.ms(la.e2e_ms)), num(fmt.ms(r.get("ttft_ms"))),
                     num(f"{la.tokens:,}"), esc(r.get("bottleneck") or NOT_MEASURED)])
    ok = sum(1 for r in req.values() if r["ok"] and r["e2e_ms"] is not None)
    thinned = any(la.tokens > data.TICKS for la in lanes)
    note = (f"All {ok:,} successful requests drawn, slowest first." if len(lanes) == ok else
            f"{len(lanes)} of {ok:,} successful requests drawn: the {data.SLOWEST} slowest by e2e, then "
            f"{len(lanes) - data.SLOWEST} spread evenly over the others' e2e ranks.")
    if thinned:
        note += f" Token ticks: at most {data.TICKS} per request (every k-th token past that)."
    body = table(["request", "group", "e2e", "TTFT", "tokens", "bottleneck"], rows, "llrrrl",
                 caption="The requests drawn")
    return Section(id="waterfalls", title=title, body=body, figures=[plots.waterfalls(lanes, thinned)], note=note)


# -- 3. distributions --------------------------------------------------------------------------

def distributions(a: Any, doc: dict[str, Any], tokens: data.TokenMaterial) -> Section:
    title = "Latency distributions"
    if not any(doc[f"{m}_ms"]["n"] for m in METRICS):
        return Section.absent("distributions", title, "no request has a measured TTFT, ITL, TPOT or e2e")
    req = a.table("attribution_requests")
    ok = req.filter(req["ok"])
    curves = {m: data.curve(ok[f"{m}_ms"].to_pylist()) for m in ("ttft", "tpot", "e2e")}
    curves["itl"] = tokens.itl
    rows = []
    for m in METRICS:
        p = doc[f"{m}_ms"]
        rows.append([esc(fmt.METRIC_NAMES[m]), esc(p["clock"] or NOT_MEASURED), n(f"{p['n']:,}", f"{m}_ms.n"),
                     *(n(fmt.ms(p[q]), f"{m}_ms.{q}") for q in ("mean", "p50", "p90", "p95", "p99"))])
    body = table(["metric", "clock", "n", "mean", "p50", "p90", "p95", "p99"], rows, "llrrrrrr",
                 caption="Percentiles (vLLM bench serve definitions)")
    slo = doc.get("slo")
    targets: dict[str, float] = {}
    if slo:
        targets = dict(slo["targets"])
        said = ", ".join(f"{esc(k)} ≤ {v:g}" for k, v in slo["targets"].items())
        good = NOT_MEASURED if slo["goodput_rps"] is None else f"{slo['goodput_rps']:.2f} req/s"
        body += (f"<p>SLOs {said}: {n(str(slo['met_requests']), 'slo.met_requests')} of "
                 f"{n(str(slo['requests']), 'slo.requests')} requests met them "
                 f"({n(fmt.share(slo['attainment']), 'slo.attainment', 100)}), goodput {num(good)}: "
                 f"{'met' if slo['met'] else 'not met'}.</p>")
    grid = [fmt.METRIC_NAMES[m] for m in METRICS if curves.get(m) is not None and not curves[m].exact]  # type: ignore[union-attr]
    notes = []
    if tokens.requests_sampled:
        notes.append(f"ITL curve: the tokens of {tokens.requests_sampled:,} of {tokens.requests_total:,} successful "
                     "requests, a uniform sample of whole requests (the trace has more tokens than are read again "
                     "to draw).")
    if grid:
        notes.append(f"{', '.join(grid)}: drawn as {data.CDF_POINTS - 1} quantiles on an even grid (more values "
                     "than can be drawn one by one).")
    note = " ".join(notes) + " The marked percentiles are the analysis' own, over every value." if notes else None
    return Section(id="distributions", title=title, body=body,
                   figures=[plots.distributions(curves, {m: doc[f"{m}_ms"] for m in METRICS}, targets)], note=note)


# -- 4. decode -------------------------------------------------------------------------------

def decode(a: Any, doc: dict[str, Any], tokens: data.TokenMaterial) -> Section:
    title = "Decode"
    d = doc["decode"]
    fit, roof = d["fit"], d["roofline"]
    basis = fit["basis"] if fit else ("step" if tokens.points else None)
    body = _decode_numbers(d)
    if basis == "batch-step":
        pts, total = data.step_points(a)
        by_batch = sorted(a.rows("steps_batch"), key=lambda r: r["batch_size"] or 0)
        note = (f"{len(pts):,} of {total:,} decode-only iterations drawn (a uniform sample); the fit is over all "
                "of them." if total > len(pts) else None)
        return Section(id="decode", title=title, body=body, figures=[plots.batched(pts, by_batch, fit, roof)],
                       note=note)
    if not tokens.points and fit is None:
        why = ("no decode token carries a KV length (kv_len) with a step time or a server-side gap"
               if d["output_tokens"] else "the trace has no tokens")
        return Section.absent("decode", title, why)
    note = None
    if tokens.points_total > len(tokens.points) or tokens.requests_sampled:
        of = (f" of {tokens.requests_sampled:,} sampled requests (of {tokens.requests_total:,})"
              if tokens.requests_sampled else "")
        note = (f"{len(tokens.points):,} of {tokens.points_total:,} decode tokens{of} drawn, spread evenly over KV "
                "length; the fit is the analysis', over every token.")
    return Section(id="decode", title=title, body=body,
                   figures=[plots.decode(tokens.points, basis or "itl", fit, roof)], note=note)


def _decode_numbers(d: dict[str, Any]) -> str:
    rows = [["per request", n(units.number(d["per_request_tok_s"], 1), "decode.per_request_tok_s"), "tok/s"],
            ["aggregate", n(units.number(d["aggregate_tok_s"], 0), "decode.aggregate_tok_s"), "tok/s"],
            ["mean concurrency", n(units.number(d["mean_concurrency"], 2), "decode.mean_concurrency"), "requests"]]
    out = table(["decode speed", "", ""], rows, "lrl")
    fit = d["fit"]
    if fit:
        r2 = NOT_MEASURED if fit["r2"] is None else f"{fit['r2']:.2f}"
        rows = [["basis", esc(fit["basis"])], ["at 0 KV", n(fmt.ms(fit["base_ms"]), "decode.fit.base_ms")],
                ["per 1k KV tokens", n(fmt.ms(fit["per_1k_kv_ms"], micro=True), "decode.fit.per_1k_kv_ms")],
                ["r²", n(r2, "decode.fit.r2")], ["points", n(f"{fit['n']:,}", "decode.fit.n")],
                ["KV range", f"{num(format(fit['kv_len_min'], ','))} – {num(format(fit['kv_len_max'], ','))}"]]
        if fit.get("per_seq_ms") is not None:
            # a slope is often a few µs: in ms at two decimals it read 0.00 ms
            rows.insert(3, ["per sequence", n(fmt.ms(fit["per_seq_ms"], micro=True), "decode.fit.per_seq_ms")])
        out += table(["fit", ""], rows, "lr")
    roof = d["roofline"]
    if roof:
        rows = [["model", esc(f"{roof['model']} on {roof['gpu_count']}× {roof['gpu']}")],
                ["ideal step", n(fmt.ms(roof["ideal_step_ms"]), "decode.roofline.ideal_step_ms")],
                ["measured step", n(fmt.ms(roof["measured_step_ms"]), "decode.roofline.measured_step_ms")],
                ["bandwidth efficiency", n(fmt.share(roof["bandwidth_efficiency"]),
                                           "decode.roofline.bandwidth_efficiency", 100)]]
        out += table(["roofline", ""], rows, "lr")
    elif d.get("roofline_note"):
        out += f"<p>No roofline: {esc(d['roofline_note'])}.</p>"
    return out


# -- 5. engine -------------------------------------------------------------------------------

def engine(a: Any, doc: dict[str, Any]) -> Section:
    title = "Engine state over time"
    e = doc.get("engine")
    if not e:
        several = [t for t in doc.get("traces") or [] if t.get("engine")]
        why = ("several traces carry engine metrics: each trace's own page draws its engine" if len(several) > 1
               else "the trace has no server_metrics table (tracetool probe --metrics-url auto scrapes the "
                    "engine's /metrics)")
        return Section.absent("engine", title, why)
    trace = doc["traces"][0]["trace"] if len(doc.get("traces") or []) == 1 else None
    series = data.engine_series(a, trace)
    if series is None or not series.t:
        return Section.absent("engine", title, "no scrape of the engine's metrics fell inside the measured window")

    def mm(key: str, obj: dict[str, Any] | None, share: bool = False) -> str:
        obj = obj or {}
        f = fmt.share if share else (lambda x: units.number(x, 1))
        scale = 100 if share else 1
        return (f"mean {n(f(obj.get('mean')), f'engine.{key}.mean', scale)} · "
                f"max {n(f(obj.get('max')), f'engine.{key}.max', scale)}")

    rows = [["engine", esc(e.get("source") or "unknown")],
            ["window", f"{n(units.number(e.get('window_s'), 1), 'engine.window_s')} s, "
                       f"{n(str(e.get('scrapes')), 'engine.scrapes')} "
                       f"scrapes ({esc(e.get('clock'))} clock)"],
            ["waiting", mm("requests_waiting", e.get("requests_waiting"))],
            ["running", mm("requests_running", e.get("requests_running"))],
            ["KV-cache use", mm("kv_cache_usage", e.get("kv_cache_usage"), share=True)],
            ["preemptions", n(units.number(e.get("preemptions"), 0), "engine.preemptions")]]
    for concept in ("queue", "tokenize", "prefill", "decode"):
        t = e.get(f"{concept}_time_ms")
        if not t:
            continue
        pct = f", {esc(bucketed_percentiles(t, fmt.ms))}" if t.get("bucketed") else ""
        rows.append([f"{concept} time", f"mean {n(fmt.ms(t.get('mean')), f'engine.{concept}_time_ms.mean')} over "
                                         f"{n(str(t.get('n')), f'engine.{concept}_time_ms.n')} requests{pct}"])
    body = table(["the engine's own metrics", ""], rows, "ll")
    notes = []
    if series.scrapes > len(series.t):
        notes.append(f"{len(series.t):,} of {series.scrapes:,} scrapes drawn (every k-th).")
    if series.arrivals_total > len(series.arrivals):
        notes.append(f"{len(series.arrivals):,} of {series.arrivals_total:,} arrivals drawn (a uniform sample).")
    notes.append("Engine figures are window aggregates, not per-request measurements.")
    return Section(id="engine", title=title, body=body, figures=[plots.engine(series)], note=" ".join(notes))


__all__ = ["decode", "distributions", "engine", "verdict", "waterfalls"]
