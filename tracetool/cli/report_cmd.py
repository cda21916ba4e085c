"""``report``: the CI latency report and pass/fail gate (docs/ci-reports.md).

Thin layer over :mod:`tracetool.report`: read the budget, analyse the trace
and the baseline, run the gate, write the chosen format to stdout or ``-o``,
and print the failing lines on stderr (exit 1 when a check failed).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tracetool.cli.common import html_option, need_html, roofline_options, said_page, warn
from tracetool.errors import EXIT_OK, EXIT_THRESHOLD, BadInput
from tracetool.untrusted import echo

if TYPE_CHECKING:
    from analyzers.options import AnalysisOptions


@click.command()
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--baseline", type=click.Path(path_type=Path), metavar="TRACE",
              help="A trace of the same workload to compare with: p50/p95 TTFT, ITL, TPOT and e2e must not be "
                   "significantly slower than the tolerance (bootstrap CI, requests as units).")
@click.option("--budget", "budget_file", type=click.Path(path_type=Path), metavar="FILE.toml",
              help="Budgets in TOML: p95_ttft_ms = 500 (absolute), p50_itl_pct = 10 (relative to the "
                   "baseline), network = 0.2 (max share of e2e), and a [report] table.")
@click.option("--format", "fmt", type=click.Choice(["md", "json", "junit"]), default="md", show_default=True,
              help="md: GitHub-flavoured Markdown (job summary); json: the versioned document; junit: JUnit "
                   "XML, one test case per check.")
@click.option("-o", "--output", type=click.Path(path_type=Path), metavar="FILE",
              help="Write the report to FILE instead of stdout.")
@click.option("--tolerance", "tolerance_pct", type=click.FloatRange(min=0), metavar="PCT",
              help="Slowdown the default regression checks allow, percent (default 5, or [report] "
                   "tolerance_pct).")
@roofline_options
@click.option("--claim", "claims", multiple=True, metavar="NAME",
              help="A story to judge (repeatable; as in analyze): network-rtt, tokenizer, ...")
@click.option("--slo", default=None, metavar="KEY=MS,...",
              help="Service-level objectives (ttft_ms, tpot_ms, itl_ms, e2e_ms): goodput and attainment in the "
                   "report, judged by the budget's goodput_min and slo_attainment_min (default: the budget's slo).")
@html_option
@click.option("--html-url", "html_url", metavar="URL",
              help="Where the page and its figures will be served from (a Pages site, an artifact URL, "
                   "artifact:// on Buildkite): the Markdown's links and images point there (default: paths "
                   "relative to -o, or to the current directory).")
def report(trace: Path, baseline: Path | None, budget_file: Path | None, fmt: str, output: Path | None,
           tolerance_pct: float | None, analysis: AnalysisOptions, claims: tuple[str, ...], slo: str | None,
           html_file: Path | None, html_url: str | None) -> int:
    """Latency report and CI gate for TRACE: percentiles, breakdown, findings, checks.

    Prints TTFT/ITL/TPOT/e2e percentiles, where the time went, the analysis'
    findings and claim verdicts. With --baseline, each p50 and p95 is compared
    with a seeded bootstrap confidence interval (requests resampled as units):
    the run fails only when the whole interval lies above the tolerance (5 %),
    so noise does not flap the gate. --budget adds absolute, relative and share
    limits. TRACE may be any v1 trace, imported ones included (what they cannot
    measure is skipped, not zero).

    --html FILE also writes a self-contained page with the plots (the checks,
    where the time went, waterfalls, CDFs, decode, the engine; a probe sweep's
    output directory gives the sweep's page) and each figure as an SVG beside
    it; the Markdown then links the page and shows the figures (--html-url
    for where they will be served).

    Exit codes: 0 all checks passed, 1 a check failed (failing lines on
    stderr), 2 usage (e.g. a relative budget without --baseline, --html
    without matplotlib), 3 bad input (not a trace, no requests, a bad budget
    file).
    """
    from analyzers.options import AnalysisOptions
    from tracetool.report import analyse, build_report, load_budget, render
    from tracetool.report.budget import Budget
    from tracetool.report.html import read_sweep
    from tracetool.slo import parse_slo

    spec = parse_slo(slo)
    if html_url is not None and html_file is None:
        from tracetool.errors import UsageError

        raise UsageError("--html-url says where the --html page is served: give --html FILE too")
    need_html(html_file)
    budget = load_budget(budget_file) if budget_file is not None else Budget()
    budget.require_baseline(baseline is not None)  # a usage error before minutes of analysis
    spec = spec or parse_slo(budget.slo)
    run = analyse(trace, AnalysisOptions.of(analysis, claims=claims), slo=spec)
    base = analyse(baseline, analysis, role="baseline") if baseline is not None else None
    for w in run.warnings:
        warn(w)
    for w in base.warnings if base else []:
        warn(f"baseline: {w}")
    rep = build_report(run, base, budget, tolerance_pct=tolerance_pct)
    doc = rep.to_json()
    sweep = read_sweep(trace)  # a probe sweep's output directory: its report is the sweep's summary
    if sweep is not None:
        doc["sweep"] = sweep
    for c in doc["checks"]:
        if c["status"] == "skip":
            warn(f"skipped {c['key']}: {c['message']}")
    if html_file is not None:
        doc["html"] = _write_page(trace, run, doc, sweep, html_file, html_url, output)
    text = render(doc, fmt)
    if output is None:
        echo(text.removesuffix("\n"), limit=None, newlines=True)  # the renderers escaped; this is the net
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as e:
            raise BadInput(f"{output}: cannot write the report ({e.strerror or e})") from e
        s = doc["summary"]
        warn(f"wrote {output}: {s['checks']} checks, {s['failed']} failed, {s['warned']} warned, "
             f"{s['skipped']} skipped")
    for line in rep.failing_lines():
        warn(line)
    return EXIT_OK if rep.passed else EXIT_THRESHOLD


def _write_page(trace: Path, run: Any, doc: dict[str, Any], sweep: dict[str, Any] | None, page: Path,
                url: str | None, output: Path | None) -> dict[str, Any]:
    """Write the page (the sweep's when TRACE is a probe sweep's output directory) and its figures;
    the report's ``html`` object: where the Markdown links them."""
    import os

    from tracetool.report.html import report_page, sweep_page, write

    html = sweep_page(sweep, trace.name) if sweep is not None else report_page(run.analysis, doc, run.doc)
    written = write(html, page, images=True)
    said_page(written)
    base = (output.parent if output is not None else Path.cwd()).resolve()

    def link(p: Path) -> str:
        if url is not None:
            return url.rstrip("/") + "/" + p.name
        return Path(os.path.relpath(p.resolve(), base)).as_posix()

    return {"page": link(written.page), "bytes": written.bytes,
            "figures": [{"path": link(f), "title": title} for f, title in written.images]}
