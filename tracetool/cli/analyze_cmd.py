"""``analyze`` and ``estimate``: where the time went in a trace, and napkin math without one.

Thin layer over :mod:`analyzers`: parse options, call :func:`analyzers.analyze`
or :func:`analyzers.estimate`, and print either the documented JSON
(docs/analysis-json.md) or a readable report. Diagnostics go to stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tracetool import units
from tracetool.cli.common import (
    emit_json,
    html_option,
    json_option,
    need_html,
    roofline_options,
    said_page,
    warn,
)
from tracetool.errors import EXIT_THRESHOLD
from tracetool.glyphs import NOT_MEASURED
from tracetool.untrusted import echo, shown

if TYPE_CHECKING:
    from analyzers.options import AnalysisOptions

_SEVERITY_MARK = {"warning": "!", "info": "·"}
_VERDICT_MARK = {"supported": "✓", "contributing": "~", "misdiagnosis": "✗", "unmeasured": "?"}


@click.command()
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@json_option
@click.option("--claim", "claims", multiple=True, metavar="NAME",
              help="A story to judge (repeatable): a component (network, queue, tokenize, preprocess, "
                   "prefill, decode, detokenize, postprocess, other), an alias (network-rtt, tokenizer, "
                   "queueing...), compute-bound ('decode is compute-bound') or throughput "
                   "('the server does thousands of tok/s').")
@roofline_options
@click.option("--threshold", "thresholds", multiple=True, metavar="NAME=VALUE",
              help="Change a verdict or finding threshold, e.g. supported_share=0.4 (names in "
                   "docs/findings.md).")
@click.option("--slo", default=None, metavar="KEY=MS,...",
              help="Service-level objectives (ttft_ms, tpot_ms, itl_ms, e2e_ms; attainment=0.99): goodput and "
                   "attainment in the output (slo).")
@click.option("--group-by", "group_by", metavar="KEY,...",
              help="Dataset keys (key=value folder names) to analyse groups by; default: the outermost key.")
@click.option("--strict", is_flag=True,
              help="Exit 1 when a trace of a dataset cannot be read (it is skipped either way).")
@click.option("--memory-limit", "memory_limit", metavar="SIZE",
              help="Memory the whole process may hold; DuckDB spills to disk past its share: 4GB, 512MiB or "
                   "30% (default: half of physical memory). Parquet traces are read lazily.")
@click.option("--engine", type=click.Choice(["duckdb", "spark"]), default="duckdb", show_default=True,
              help="Run the analyzer modules on DuckDB, or on Apache Spark SQL (the spark extra and Java 17; "
                   "docs/fleet.md).")
@click.option("--spark-master", metavar="URL", help="Spark master URL for --engine spark (default local[*]).")
@html_option
def analyze(traces: tuple[Path, ...], as_json: bool, claims: tuple[str, ...], analysis: AnalysisOptions,
            thresholds: tuple[str, ...], slo: str | None, group_by: str | None, strict: bool,
            memory_limit: str | None, engine: str, spark_master: str | None, html_file: Path | None) -> int:
    """Attribute each request's latency and say which story about it is wrong.

    TRACES are trace directories, or datasets: directory trees of traces whose
    key=value folder names (server=a/hour=2026-12-05T10/) are grouping keys
    (docs/fleet.md). Several traces are analysed together, per trace, and per
    group (--group-by). A dataset's unreadable traces are skipped and named on
    stderr (exit 1 with --strict); traces of different versions are refused.
    Components follow the attribution rule of docs/trace-format.md (network, queue, tokenize,
    preprocess, prefill, decode, detokenize, postprocess, other); TTFT, ITL and
    TPOT follow vLLM bench serve. Decode is fitted against KV length and, when
    model and GPU are known (meta.json or --model/--gpu), compared with the
    memory-bandwidth roofline. Findings quote the measured numbers
    (docs/findings.md). --html FILE also writes a self-contained page with
    the plots (where the time went, request waterfalls, latency CDFs, decode
    against KV length, the engine over time), its numbers those of --json.
    Exit 0; 1 with --strict when a dataset's trace was skipped; 2 for --html
    without matplotlib or with --engine spark; 3 when nothing can be analysed.
    """
    import analyzers
    from analyzers.fleet import analyze_dataset
    from analyzers.options import AnalysisOptions
    from tracetool.dataset import DEFAULT_MEMORY_FRACTION, parse_memory, physical_memory
    from tracetool.slo import parse_slo

    spec = parse_slo(slo)
    if html_file is not None and engine == "spark":
        from tracetool.errors import UsageError

        raise UsageError("--html draws from DuckDB's tables: use it with --engine duckdb")
    need_html(html_file)
    th = analyzers.Thresholds().with_overrides(dict(analyzers.parse_threshold(t) for t in thresholds))
    keys = None if group_by is None else [k.strip() for k in group_by.split(",") if k.strip()]
    limit = (parse_memory(memory_limit) if memory_limit is not None
             else int(physical_memory() * DEFAULT_MEMORY_FRACTION))
    options = AnalysisOptions.of(analysis, claims=claims, thresholds=th, memory_limit=limit, engine=engine,
                                 spark_master=spark_master)
    a = analyze_dataset(list(traces), options, group_by=keys)
    doc = a.to_json()
    if spec is not None:
        doc["slo"] = a.slo(spec)
    for w in doc["warnings"]:
        warn(w)
    if doc["itl_ms"]["n"] == 0 and doc["ttft_ms"]["n"] == 0:
        warn("note: no token rows with a start to measure from: TTFT, ITL and TPOT are not measured")
    if html_file is not None:
        from tracetool.report.html import analysis_page, write

        said_page(write(analysis_page(a.analysis, doc), html_file))
    if as_json:
        emit_json(doc)
    else:
        print_analysis(doc)
    return EXIT_THRESHOLD if strict and a.bad else 0


def print_analysis(doc: dict[str, Any]) -> None:
    """The readable form of an ``analyze --json`` document (``analyze``, ``demo``)."""
    from analyzers.engine import BASIS as ENGINE_BASIS

    traces = doc["traces"]
    where = shown(traces[0]["path"]) if len(traces) == 1 else f"{len(traces)} traces"
    failed = f", {doc['failed_requests']:,} failed" if doc["failed_requests"] else ""
    echo(f"{where}: {doc['requests']:,} requests{failed}, {doc['decode']['output_tokens'] or 0:,} tokens")
    roof = doc["decode"]["roofline"]
    if roof:
        echo(f"model {roof['model']} on {roof['gpu_count']}x {roof['gpu']} ({roof['source']})")
    echo(doc["headline"])
    echo("")
    echo("where the time went (mean per request; share of summed e2e)")
    ne = doc.get("network_evidence") or {}
    for name, c in doc["components"].items():
        if name == "frontend" and not c["measured"]:
            continue  # only a server that publishes its engine's spans has one (said under network)
        if c.get("basis") == ENGINE_BASIS:
            # the engine's window mean from its histograms: what the headline says, marked as such
            echo(f"  {name:<12} {units.ms(c['ms'], 1):>10} {units.share(c['share']):>8}  engine metrics: "
                 "a window mean, not per request")
            continue
        if name == "network" and not c["measured"] and ne.get("basis") == "unsplit":
            echo(f"  {name:<12} {'not split':>10} {'':>8}  network + server frontend "
                 f"{units.ms(ne.get('outside_ms'), 1)} ({units.share(ne.get('outside_share'))}): "
                 "no round trip measured to split them")
            continue
        if not c["measured"]:
            echo(f"  {name:<12} {'not measured':>10}")
            continue
        bar = "█" * round((c["share"] or 0) * 30)
        mark = "  ◀ bottleneck" if name == doc["bottleneck"] else ""
        echo(f"  {name:<12} {units.ms(c['ms'], 1):>10} {units.share(c['share']):>8}  {bar}{mark}")
    echo("")
    echo(f"  {'latency':<8} {'clock':<7} {'n':>9} {'mean':>10} {'p50':>10} {'p90':>10} {'p95':>10} {'p99':>10}")
    for key in ("e2e", "ttft", "itl", "tpot"):
        p = doc[f"{key}_ms"]
        echo(f"  {key:<8} {p['clock'] or NOT_MEASURED:<7} {p['n']:>9,} " + " ".join(
            f"{units.ms(p[q], 1):>10}" for q in ("mean", "p50", "p90", "p95", "p99")))
    d = doc["decode"]
    echo("")
    if d["per_request_tok_s"] is not None:
        agg = f"{d['aggregate_tok_s']:,.0f}" if d["aggregate_tok_s"] is not None else NOT_MEASURED
        echo(f"decode   {d['per_request_tok_s']:,.1f} tok/s per request · {agg} tok/s aggregate")
    fit = d["fit"]
    if fit:
        sign = "-" if fit["per_1k_kv_ms"] < 0 else "+"
        r2 = NOT_MEASURED if fit["r2"] is None else f"{fit['r2']:.2f}"
        echo(f"  fit    {fit['basis']} = {units.ms(fit['base_ms'], 2)} {sign} "
             f"{units.ms(abs(fit['per_1k_kv_ms']), 3)} per 1k KV "
             f"(r² {r2}, {fit['n']:,} tokens, kv {fit['kv_len_min']:,}-{fit['kv_len_max']:,})")
    if roof:
        echo(f"  roofline ideal {units.ms(roof['ideal_step_ms'], 2)} vs measured "
             f"{units.ms(roof['measured_step_ms'], 2)}"
             f" → {units.share(roof['bandwidth_efficiency'])} of peak bandwidth")
    elif d["roofline_note"]:
        echo(f"  roofline: none ({d['roofline_note']})")
    if doc.get("engine"):
        _print_engine(doc["engine"])
    if doc.get("slo"):
        sl = doc["slo"]
        echo("")
        echo(f"SLO {', '.join(f'{k} <= {v:g}' for k, v in sl['targets'].items())}: {sl['met_requests']} of "
             f"{sl['requests']} requests met it ({units.share(sl['attainment'])}), goodput "
             f"{NOT_MEASURED if sl['goodput_rps'] is None else format(sl['goodput_rps'], '.2f')} req/s: "
             + ("met" if sl["met"] else f"NOT met (needs {units.share(sl['attainment_target'])})"))
    if doc.get("tail"):
        _print_tail(doc["tail"])
    if doc["findings"]:
        echo("")
        echo("findings")
        for f in doc["findings"]:
            echo(f"  {_SEVERITY_MARK.get(f['severity'], '-')} {f['id']}: {f['title']}")
            echo(f"      {f['detail']}")
    if doc["claims"]:
        echo("")
        echo("claims")
        for c in doc["claims"]:
            of = f"of the {c['scope']} tail's gap" if c.get("scope") else "of e2e"
            echo(f"  {_VERDICT_MARK.get(c['verdict'], '-')} \"{c['claim']}\": {c['verdict']} "
                 f"({units.share(c['share'])} {of})")
            echo(f"      {c['detail']}")
    if len(traces) > 1 and "requests" in traces[0]:
        echo("")
        echo(f"  {'trace':<24} {'requests':>9} {'e2e p50':>10} {'ttft p50':>10} {'itl p50':>10}  bottleneck")
        for t in traces:
            echo(f"  {shown(t['trace'], 24):<24} {t['requests']:>9,} {units.ms(t['e2e_ms']['p50'], 1):>10} "
                 f"{units.ms(t['ttft_ms']['p50'], 1):>10} {units.ms(t['itl_ms']['p50'], 1):>10}  "
                 f"{t['bottleneck'] or NOT_MEASURED}")
    groups = doc.get("groups") or []
    if groups:
        echo("")
        by = ", ".join(doc["dataset"]["group_by"])
        echo(f"  {'group (' + by + ')':<24} {'traces':>6} {'requests':>9} {'e2e p50':>10} {'ttft p50':>10} "
             f"{'itl p50':>10}  bottleneck")
        for g in groups:
            name = shown(",".join(NOT_MEASURED if v is None else str(v) for v in g["group"].values()), 24)
            echo(f"  {name:<24} {len(g['traces']):>6} {g['requests']:>9,} {units.ms(g['e2e_ms']['p50'], 1):>10} "
                 f"{units.ms(g['ttft_ms']['p50'], 1):>10} {units.ms(g['itl_ms']['p50'], 1):>10}  "
                 f"{g['bottleneck'] or NOT_MEASURED}")


@click.command()
@click.option("--model", required=True, help="Model preset (llama-3.1-8b, llama-3.1-70b, qwen2.5-72b, "
                                              "deepseek-v3, ...) or a local Hugging Face config.json.")
@click.option("--gpu", required=True, help="GPU preset (a100-80gb, h100-sxm, h200, b200, mi300x, l4, ...).")
@click.option("--tp", type=int, default=1, show_default=True, help="GPUs the model is sharded over.")
@click.option("--weight-dtype", default="bf16", show_default=True, help="bf16, fp8, int8, int4, ...")
@click.option("--kv-dtype", default="bf16", show_default=True, help="KV-cache dtype: bf16, fp8, ...")
@click.option("--batch", type=int, default=1, show_default=True, help="Sequences decoding together.")
@click.option("--prompt", type=int, default=1024, show_default=True, help="Prompt tokens.")
@click.option("--output", type=int, default=256, show_default=True, help="Output tokens.")
@click.option("--efficiency", type=float, default=0.7, show_default=True,
              help="Achieved share of peak memory bandwidth in decode (0.55-0.85 typical).")
@click.option("--prefill-efficiency", type=float, default=0.5, show_default=True,
              help="Achieved share of peak FLOP/s in prefill.")
@click.option("--rtt-ms", type=float, default=1.0, show_default=True,
              help="Network round trip, ms (same region 0.25-3, cross-region 25-250).")
@json_option
def estimate(model: str, gpu: str, tp: int, weight_dtype: str, kv_dtype: str, batch: int, prompt: int,
             output: int, efficiency: float, prefill_efficiency: float, rtt_ms: float, as_json: bool) -> int:
    """Napkin math without a trace: expected decode step, prefill, TTFT and e2e.

    Decode streams weights plus the KV cache each step: step = (weight bytes +
    batch x kv_len x KV bytes/token) / (bandwidth x tp), divided by
    --efficiency. Prefill: 2 x params x prompt FLOPs plus attention, at the
    GPU's peak for the weight dtype. Components use analyze's vocabulary.
    """
    import analyzers

    e = analyzers.estimate(model, gpu, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype, batch=batch,
                           prompt=prompt, output=output, efficiency=efficiency,
                           prefill_efficiency=prefill_efficiency, rtt_ms=rtt_ms)
    if as_json:
        emit_json(e.to_json())
        return 0
    echo(f"{e.model} on {e.tp}x {e.gpu}, weights {e.weight_dtype}, KV {e.kv_dtype}, batch {e.batch}, "
         f"prompt {e.prompt:,}, output {e.output:,}")
    echo(f"  weights read per step   {e.weight_bytes / 1e9:,.2f} GB ({e.weight_bytes_per_gpu / 1e9:,.2f} GB per GPU)")
    echo(f"  KV cache per step       {e.kv_bytes_per_gpu * e.tp / 1e9:,.2f} GB at mean kv_len {e.kv_len_mean:,.0f} "
         f"({e.kv_bytes_per_token:,.0f} B/token)")
    echo(f"  decode step             {units.ms(e.decode_step_ms_ideal, 2)} ideal ({e.decode_bound}-bound), "
         f"{units.ms(e.decode_step_ms, 2)} at {e.efficiency:.0%} → {e.per_request_tok_s:,.0f} tok/s per request, "
         f"{e.aggregate_tok_s:,.0f} tok/s aggregate")
    echo(f"  prefill                 {e.prefill_flops:.3g} FLOP: {units.ms(e.prefill_ms_ideal, 2)} ideal, "
         f"{units.ms(e.prefill_ms, 2)} at {e.prefill_efficiency:.0%}")
    echo(f"  TTFT {units.ms(e.ttft_ms, 2)} · e2e {units.ms(e.e2e_ms, 2)}")
    for name, c in e.components.items():
        if c["ms"] > 0:
            echo(f"    {name:<12} {units.ms(c['ms'], 2):>10} {units.share(c['share']):>8}")
    for n in e.notes:
        echo(f"  note: {n}")
    return 0


def _print_engine(e: dict[str, Any]) -> None:
    """The engine's own metrics over the window: state, then each time histogram with its
    percentiles as bounded as its buckets allow (tracetool.glyphs, as the TUI shows them)."""
    from tracetool.glyphs import bucketed_percentiles

    def num(x: Any, digits: int = 1) -> str:
        return NOT_MEASURED if x is None else f"{x:,.{digits}f}"

    w, r, kv = e.get("requests_waiting") or {}, e.get("requests_running") or {}, e.get("kv_cache_usage") or {}
    echo("")
    echo(f"engine   {e.get('source') or 'unknown engine'} metrics over {num(e.get('window_s'))} s "
               f"({e.get('scrapes')} scrapes, {e.get('clock')} clock)")
    echo(f"  waiting mean {num(w.get('mean'))} max {num(w.get('max'), 0)} · running mean "
               f"{num(r.get('mean'))} max {num(r.get('max'), 0)} · KV cache mean {units.share(kv.get('mean'))} "
               f"max {units.share(kv.get('max'))} · preemptions {num(e.get('preemptions'), 0)}")
    for concept in ("queue", "tokenize", "prefill", "decode"):
        t = e.get(f"{concept}_time_ms")
        if not t:
            continue
        pct = f", {bucketed_percentiles(t, lambda v: units.ms(v, 1))}" if t.get("bucketed") else ""
        echo(f"  {concept + ' time':<14} mean {units.ms(t.get('mean'), 1)} over {t.get('n')} requests{pct}")


def _print_tail(tail: dict[str, Any]) -> None:
    """The tail against typical requests (p40-p60): per metric, what is explained and where its time is."""
    echo("")
    echo("the tail (above p99, else p95, against the typical p40-p60 requests; share of the gap)")
    for metric in ("ttft", "e2e", "tpot", "itl"):
        t = tail.get(metric)
        if t:
            echo(f"  {t['sentence']}")
