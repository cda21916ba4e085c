"""``--html FILE`` without a browser: bad input gives a page or one line, never a traceback; trace
strings are escaped; the page is self-contained and the same bytes every time; the decode section
draws what the analysis fitted (under batching too) and the roofline where model and GPU are
known, each line where the document puts it; the Markdown report points to the page and its
figures; without matplotlib, one line and exit 2."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from html_drawn import Axes, axes
from html_fixtures import SAMPLES, at, check_numbers, engine_scope_trace, engine_trace, hostile_trace, marked, section

from tests.conftest import REPO, make_trace, spans_table
from tracetool.report.html.figures import ACCENT, SECOND

pytest.importorskip("matplotlib", reason="the html extra (matplotlib) is not installed")
MS = 1_000_000
#: The decode figures draw the fit in the page's accent colour, the roofline (and, under batching,
#: mean step per batch size) in its second colour.
FIT, ROOFLINE = ACCENT, SECOND


def _sections(page: str) -> dict[str, str]:
    """section id -> "drawn" or its reason."""
    out = {}
    for sid, absent, rest in re.findall(r'<section id="([^"]+)"[^>]*data-absent="(true|false)">(.*?)</section>',
                                        page, re.S):
        reason = re.search(r'<p class="reason">(.*?)</p>', rest)
        out[sid] = reason.group(1) if absent == "true" and reason else "drawn"
    return out


def test_the_page_is_self_contained_and_the_same_bytes_every_time(cli: Any, tmp_path: Path) -> None:
    pages = []
    for k in range(2):
        p = tmp_path / f"chat{k}.html"
        assert cli("analyze", SAMPLES / "chat", "--html", p).code == 0
        pages.append(p.read_text())
    assert pages[0] == pages[1]
    page = pages[0]
    assert "<script" not in page and "@import" not in page and "url(http" not in page
    # nothing to fetch: every src/href is an anchor in the page (the SVGs' xmlns are names, not fetches)
    refs = re.findall(r'\b(?:src|href|xlink:href)="([^"]*)"', page)
    assert refs and all(r.startswith("#") for r in refs), sorted({r for r in refs if not r.startswith("#")})
    assert "default-src 'none'" in page  # and the browser refuses any fetch anyway
    assert "data:image" not in page  # every figure is vector: no raster inside an SVG
    assert len(page.encode()) < 2_000_000


def test_strings_from_a_trace_are_escaped_and_never_markup(cli: Any, tmp_path: Path) -> None:
    trace = hostile_trace(tmp_path / "hostile")
    page = tmp_path / "h.html"
    r = cli("analyze", trace, "--html", page)
    assert r.code == 0, r.err
    text = page.read_text()
    assert "<script>" not in text and "<img" not in text
    assert 'title="&lt;script&gt;alert(1)&lt;/script&gt;$x^2$&amp;&quot;&#x27;&lt;img' in text  # the table, whole
    assert "$x^2$" in text  # mathtext stayed off: the dollars are text in the figure too
    ET.fromstring(re.search(r"<svg.*?</svg>", text[text.index('id="waterfalls"'):], re.S).group(0))  # valid XML


def test_a_trace_without_tokens_gives_a_page_that_says_what_is_missing(cli: Any, tmp_path: Path) -> None:
    rows = []
    for i in range(3):
        s = i * 400 * MS
        rows += [(f"r{i}", "client.request", s, s + 300 * MS, "client"),
                 (f"r{i}", "server.request", s + 10 * MS, s + 290 * MS, "server"),
                 (f"r{i}", "prefill", s + 20 * MS, s + 80 * MS, "server")]
    trace = make_trace(tmp_path / "no-tokens", {"spans": spans_table(rows)})
    page = tmp_path / "p.html"
    r = cli("analyze", trace, "--html", page)
    assert r.code == 0, r.err
    got = _sections(page.read_text())
    assert got["verdict"] == "drawn" and got["waterfalls"] == "drawn" and got["distributions"] == "drawn"
    assert got["decode"] == "Not drawn: the trace has no tokens"
    assert "no server_metrics table" in got["engine"]
    assert "Traceback" not in r.err


def test_slos_are_drawn_as_lines_and_said_beside_them(cli: Any, tmp_path: Path) -> None:
    page = tmp_path / "slo.html"
    r = cli("analyze", SAMPLES / "chat", "--slo", "ttft_ms=150,e2e_ms=3000", "--json", "--html", page)
    assert r.code == 0, r.err
    slo = json.loads(r.out)["slo"]
    text = page.read_text()
    assert "SLO 150 ms" in text and "SLO 3000 ms" in text and "SLO 50 ms" not in text  # a line per target
    assert f'data-key="slo.met_requests">{slo["met_requests"]}<' in text


def test_a_page_that_cannot_be_written_is_one_line_and_exit_3(tmp_path: Path) -> None:
    r = _run("analyze", SAMPLES / "network", "--html", tmp_path / "no-such-dir" / "x.html")
    assert r.returncode == 3 and r.stderr.count("\n") == 1
    assert "x.html: cannot write the page (No such file or directory)" in r.stderr


@pytest.mark.parametrize("handshake", [False, True])
def test_network_and_the_servers_frontend_are_shown_as_the_analysis_splits_them(handshake: bool, cli: Any,
                                                                                 tmp_path: Path) -> None:
    page = tmp_path / "v.html"
    r = cli("analyze", engine_scope_trace(tmp_path / "vllm", handshake), "--json", "--html", page)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    text = page.read_text()
    rows = dict(re.findall(r"<tr><td>([a-z_]+)</td>(.*?)</tr>", text[text.index('id="verdict"'):]))
    if handshake:  # rtt-split: frontend is a component of its own, network the round trip
        assert doc["network_evidence"]["basis"] == "rtt-split" and doc["components"]["frontend"]["measured"]
        assert 'data-key="components.frontend.ms"' in rows["frontend"] and "not split" not in text
    else:  # unsplit: neither is measured; the page says what the 40 ms outside the engine holds
        assert doc["network_evidence"]["basis"] == "unsplit" and "frontend" not in rows
        assert "not split from the server&#x27;s frontend: network + frontend 40.0 ms per request" in rows["network"]
        assert "not split (network + frontend)" in text  # in the figure too, never a zero bar


def test_the_engine_section_shows_histogram_percentiles_as_bounds(cli: Any, tmp_path: Path) -> None:
    page = tmp_path / "e.html"
    r = cli("analyze", engine_trace(tmp_path / "engine"), "--json", "--html", page)
    assert r.code == 0, r.err
    queue = json.loads(r.out)["engine"]["queue_time_ms"]
    assert queue["bucketed"] and queue["p50_max"] is not None
    text = page.read_text()
    assert _sections(text)["engine"] == "drawn"
    # the bound, never a bare estimate: "p50 ≤ 0.20 ms, p95 ≤ 0.20 ms (from buckets)"
    assert re.search(r"p50 ≤ [\d.]+ ms, p95 ≤ [\d.]+ ms \(from buckets\)", text)
    # the engine's numbers fill the queue component: hatched in the figure, said in the table
    assert "engine metrics: a window mean, not per request" in text


def _on(ax: Axes, got: list[tuple[float, float]], want: list[tuple[float, float]]) -> None:
    """The drawn vertices are where ``want`` puts them, to half a pixel on each axis."""
    assert len(got) == len(want), (got, want)
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        assert abs(gx - wx) <= abs(ax.x[0]) / 2 and abs(gy - wy) <= abs(ax.y[0]) / 2, (got, want)


def _line(base: float, per_1k: float, xs: tuple[float, float]) -> list[tuple[float, float]]:
    return [(x, base + per_1k * x / 1000) for x in xs]


def test_a_batched_engine_draws_decode_under_batching_where_the_analysis_and_its_steps_put_it(
        cli: Any, tmp_path: Path) -> None:
    """A continuous-batching engine's trace (one steps row per iteration, tests/analyzers/batch_sim.py;
    its meta.json names the model and the GPU): step time against the batch's summed KV, one colour
    per batch size group, the fit at the smallest and largest batch and the roofline's ideal; beside
    it, mean decode-only step per batch size; the fit's and the roofline's numbers as text."""
    from tests.analyzers.batch_sim import Config, decode_only_steps, run

    sim = run(tmp_path / "batched", Config(requests=24, rate_per_s=0, output=(60, 120)))
    page = tmp_path / "b.html"
    r = cli("analyze", sim.path, "--json", "--html", page)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    fit, roof = doc["decode"]["fit"], doc["decode"]["roofline"]
    assert fit["basis"] == "batch-step" and fit["per_seq_ms"] is not None and roof is not None
    dec = section(page.read_text(), "decode")
    assert 'data-absent="false"' in dec and re.search(r"<td>basis</td><td[^>]*>batch-step</td>", dec)
    numbers = marked(dec)
    assert {f"decode.fit.{k}" for k in ("base_ms", "per_1k_kv_ms", "per_seq_ms", "r2", "n")} | {
        f"decode.roofline.{k}" for k in ("ideal_step_ms", "measured_step_ms", "bandwidth_efficiency")} <= {
        x["key"] for x in numbers}
    check_numbers(numbers, doc)
    small = [x for x in numbers if x["key"].startswith("decode.fit.") and x["key"].endswith("_ms")
             and 0 < abs(at(doc, x["key"]) or 0) < 0.1]
    assert small and all(x["text"].endswith("µs") for x in small), small  # a slope of µs, not "0.06 ms"
    svgs = re.findall(r"<svg.*?</svg>", dec, re.S)
    assert len(svgs) == 1 and "<title>Decode under batching: step time against summed KV and batch size" in svgs[0]
    by_kv, by_batch = axes(svgs[0])

    steps = decode_only_steps(sim)
    sizes = sorted({b for _, _, b in steps})
    assert len(steps) == fit["n"] <= 3000 and len(sizes) > 1  # every iteration drawn, several batch sizes
    # one legend entry per group of neighbouring batch sizes, together every size there is; the roofline's
    legend = by_kv.legend()
    assert legend[-1] == "roofline ideal", legend
    entries = [re.fullmatch(r"batch (\d+)(?:–(\d+))?", t) for t in legend[:-1]]
    groups = [(int(m.group(1)), int(m.group(2) or m.group(1))) for m in entries if m]
    assert len(groups) == len(entries), legend
    assert groups and groups == sorted(groups) and groups[0][0] == sizes[0] and groups[-1][1] == sizes[-1]
    assert all(any(lo <= b <= hi for lo, hi in groups) for b in sizes)
    assert all(hi < lo for (_, hi), (lo, _) in pairwise(groups))
    # the fit over the KV range at the smallest and the largest batch (and the middle one), each named
    kv = (fit["kv_len_min"], fit["kv_len_max"])
    named = {int(m.group(1)) for m in (re.fullmatch(r"fit, batch (\d+)", t) for t in by_kv.texts()) if m}
    assert {sizes[0], sizes[-1]} <= named <= set(sizes)
    drawn = by_kv.lines(FIT, dashed=False)
    assert len(drawn) == len(named)
    for line in drawn:  # on the fit at one of the named sizes (this engine's cost per sequence is ~0)
        near = min(named, key=lambda b: abs(line[0][1] - fit["per_seq_ms"] * b - fit["base_ms"]
                                            - fit["per_1k_kv_ms"] * kv[0] / 1000))
        _on(by_kv, line, _line(fit["base_ms"] + fit["per_seq_ms"] * near, fit["per_1k_kv_ms"], kv))
    # the roofline's ideal step over the same range
    (ideal,) = by_kv.lines(ROOFLINE, dashed=True)
    _on(by_kv, ideal, _line(roof["ideal_base_ms"], roof["ideal_per_1k_kv_ms"], kv))
    # mean step per batch size: its decode-only iterations, as the scatter beside it (an iteration that
    # also prefills is stretched by the prompt: it is in neither)
    ms: dict[int, list[float]] = {}
    for step_ms, _, b in steps:
        ms.setdefault(b, []).append(step_ms)
    (mean,) = by_batch.lines(SECOND, dashed=False)
    _on(by_batch, mean, [(b, sum(v) / len(v)) for b, v in sorted(ms.items())])
    assert {"batch size", "mean decode-only step (ms)"} <= set(by_batch.texts())
    st = sim.steps  # this engine prefills in iterations of their own: the all-iteration mean differs
    assert any(p > 0 for p in st["prefill_tokens"])


@pytest.mark.parametrize("known", [True, False])
def test_the_roofline_is_drawn_and_stated_where_the_model_and_gpu_are_known(known: bool, cli: Any,
                                                                           tmp_path: Path) -> None:
    """Llama 3.1 8B on an H100 (tests/tui/tui_traces.py's chat: step times at 70 % of the
    roofline): the decode figure draws the fit and the roofline's ideal where the document puts
    them, and the numbers say both; without the GPU in meta.json, no roofline line and the note why."""
    from tests.tui.tui_traces import chat_trace

    trace = chat_trace(tmp_path / "chat", requests=4, output=120)
    meta = json.loads((trace / "meta.json").read_text())
    if not known:
        del meta["hardware"]
        (trace / "meta.json").write_text(json.dumps(meta))
    page = tmp_path / "r.html"
    r = cli("analyze", trace, "--json", "--html", page)
    assert r.code == 0, r.err
    d = json.loads(r.out)["decode"]
    fit, roof = d["fit"], d["roofline"]
    assert fit is not None and fit["basis"] == "step"
    dec = section(page.read_text(), "decode")
    numbers = marked(dec)
    check_numbers(numbers, {"decode": d})
    (svg,) = re.findall(r"<svg.*?</svg>", dec, re.S)
    (ax,) = axes(svg)
    kv = (fit["kv_len_min"], fit["kv_len_max"])
    (fitted,) = ax.lines(FIT, dashed=False)
    _on(ax, fitted, _line(fit["base_ms"], fit["per_1k_kv_ms"], kv))
    roof_keys = {x["key"] for x in numbers if x["key"].startswith("decode.roofline.")}
    if known:
        assert roof is not None and roof["model"] == meta["model"]["name"] and roof["gpu"] == meta["hardware"]["gpu"]
        (ideal,) = ax.lines(ROOFLINE, dashed=True)
        _on(ax, ideal, _line(roof["ideal_base_ms"], roof["ideal_per_1k_kv_ms"], kv))
        assert {"fit (all tokens)", "roofline ideal"} <= set(ax.legend())
        assert roof_keys == {f"decode.roofline.{k}" for k in ("ideal_step_ms", "measured_step_ms",
                                                              "bandwidth_efficiency")}
        assert html.escape(roof["model"]) in dec and html.escape(roof["gpu"]) in dec
    else:
        assert roof is None and d["roofline_note"]
        assert ax.lines(ROOFLINE, dashed=True) == [] and "roofline ideal" not in ax.texts() and not roof_keys
        assert f"No roofline: {html.escape(d['roofline_note'])}." in dec


def test_an_empty_trace_is_one_line_and_exit_3(tmp_path: Path) -> None:
    empty = make_trace(tmp_path / "empty", {})
    for cmd in (["analyze", empty], ["report", empty], ["diff", empty, empty]):
        r = _run(*cmd, "--html", tmp_path / "x.html")
        assert r.returncode == 3, r.stderr
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("tracetool: error: ") and "Traceback" not in r.stderr
        assert not (tmp_path / "x.html").exists()


def test_a_one_level_sweep_and_a_broken_summary(cli: Any, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    (sweep / "4").mkdir(parents=True)
    for f in (SAMPLES / "chat").iterdir():
        (sweep / "4" / f.name).write_bytes(f.read_bytes())
    level = {"level": 4, "trace": str(sweep / "4"), "requests": 6, "ok": 6, "failed": 0,
             "ttft_ms": {"p50": 112.0, "p90": 150.0, "p99": 165.0}, "itl_ms": {"p50": 17.0, "p90": 33.0, "p99": 52.0},
             "e2e_ms": {"p50": 2960.0, "p90": 3070.0, "p99": 3080.0}, "request_throughput": 0.68,
             "output_token_throughput": 131.0, "shares": {"decode": 0.96, "prefill": 0.02}, "bottleneck": "decode",
             "client_bound": None, "slo": None}
    (sweep / "sweep.json").write_text(json.dumps({"format": "tracetool-sweep", "version": 1, "axis": "rate",
                                                   "levels": [level], "moved": None, "best_level": None}))
    page = tmp_path / "s.html"
    r = cli("report", sweep, "--html", page, "-o", tmp_path / "s.md")
    assert r.code == 0, r.err
    text = page.read_text()
    assert _sections(text) == {"sweep": "drawn"} and "One level: nothing to compare across levels" in text
    assert "goodput: no SLOs given (--slo)" in text
    (sweep / "sweep.json").write_text("{not json")
    bad = _run("report", sweep, "--html", page)
    assert bad.returncode == 3 and "sweep.json: not a readable sweep summary" in bad.stderr
    assert bad.stderr.count("\n") == 1


def test_the_markdown_report_points_to_the_page_and_shows_its_figures(cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    r = cli("report", SAMPLES / "queueing", "--html", out / "latency.html", "-o", out / "report.md")
    assert r.code == 0, r.err
    md = (out / "report.md").read_text()
    assert "### Pictures" in md and "](latency.html)" in md
    images = re.findall(r"!\[([^\]]+)\]\(([^)]+)\)", md)
    assert len(images) == 4 and images[0][0].startswith("Where the time went")
    for _, path in images:
        svg = (out / path).read_text()
        root = ET.fromstring(svg.split("\n", 1)[1])  # a standalone SVG: the page's colours inside
        assert root.tag.endswith("svg") and "--fg:" in svg and "prefers-color-scheme: dark" in svg
    r = cli("report", SAMPLES / "queueing", "--format", "json", "--html", out / "latency.html",
            "--html-url", "https://ci.example.invalid/artifacts/run-7/")
    doc = json.loads(r.out)
    assert doc["html"]["page"] == "https://ci.example.invalid/artifacts/run-7/latency.html"
    assert [f["path"].rsplit("/", 1)[1] for f in doc["html"]["figures"]] == [p for _, p in images]
    assert cli("report", SAMPLES / "queueing", "--html-url", "x").code == 2


def test_without_matplotlib_html_is_one_line_and_exit_2_before_any_analysis(tmp_path: Path) -> None:
    block = "import sys; sys.modules['matplotlib'] = None; from tracetool.cli import main; sys.exit(main(sys.argv[1:]))"
    missing = tmp_path / "no-such-trace"  # refused before the trace is even read
    for cmd in (["analyze", missing], ["report", missing], ["diff", missing, missing]):
        r = subprocess.run([sys.executable, "-c", block, *map(str, cmd), "--html", str(tmp_path / "x.html")],
                           capture_output=True, text=True, cwd=REPO, timeout=120)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip() == ("tracetool: error: --html needs matplotlib, which is not installed "
                                    "(pip install 'tracetool-llm[html]')")


@pytest.mark.slow
def test_a_trace_past_the_sample_threshold_gets_a_bounded_sampled_page(tmp_path: Path) -> None:
    """Past SAMPLE_TOKENS the per-token figures read a sample of whole requests, and the page stays a few MB
    (its time on a 10M-token trace is benchmarks/bench_html.py's figure, not a test's)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gen_trace import generate

    import analyzers
    from tracetool.report.html import analysis_page, write
    from tracetool.report.html.data import SAMPLE_TOKENS

    generate(tmp_path / "big", tokens=4 * SAMPLE_TOKENS)
    a = analyzers.analyze(tmp_path / "big")
    written = write(analysis_page(a, a.to_json()), tmp_path / "big.html")
    text = written.page.read_text()
    assert written.bytes < 3_000_000 and "a uniform sample of whole requests" in text
    assert all(v == "drawn" for k, v in _sections(text).items() if k != "engine")


def _run(*args: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracetool", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
