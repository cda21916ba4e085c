"""Sweeps: ``tracetool probe --concurrency 1,4,16`` or ``--rate 1,2,4`` runs one level after another.

Each level is a whole probe run into ``OUT/<level>/`` (a valid trace each), and
the sweep summary puts the levels side by side: TTFT, ITL and e2e percentiles,
throughput, and the attribution's shares per component (the rule of
docs/trace-format.md, as ``tracetool analyze`` applies it).
``moved`` says in one line where the bottleneck moved ("queue share 3 % at 4,
61 % at 16"); with SLOs, ``best_level`` is the highest level whose requests
still meet them (docs/serving.md).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from tracetool import units
from tracetool.errors import BadInput, UsageError
from tracetool.glyphs import NOT_MEASURED
from tracetool.serving.probe import ProbeConfig, run_probe
from tracetool.serving.report import probe_report
from tracetool.serving.schedule import print_progress
from tracetool.untrusted import echo

FORMAT = "tracetool-sweep"
VERSION = 1


def parse_levels(text: str, option: str, integer: bool) -> list[float]:
    """``4`` or ``1,4,16`` -> the levels, each > 0 (integers for --concurrency), in the order given."""
    out: list[float] = []
    for part in str(text).split(","):
        try:
            v = int(part) if integer else float(part)
        except ValueError:
            raise UsageError(f"{option} {text!r}: expected a number or a comma-separated list") from None
        if v <= 0:
            raise UsageError(f"{option} {text!r}: every level must be > 0")
        out.append(v)
    if len(set(out)) != len(out):
        raise UsageError(f"{option} {text!r}: a level repeats")
    return out


def level_name(level: float) -> str:
    return f"{level:g}"


def run_sweep(cfg: ProbeConfig, axis: str, levels: list[float], slo: Any = None) -> dict[str, Any]:
    """Probe each level in turn into ``cfg.out/<level>``; the sweep summary (documented JSON)."""
    if cfg.out is None:
        raise UsageError("a sweep writes one trace per level: pass -o DIR")
    rows = []
    for i, level in enumerate(levels):
        out = Path(cfg.out) / level_name(level)
        if cfg.progress:
            print_progress(f"sweep: {axis} {level_name(level)} ({i + 1} of {len(levels)})", final=True)
        c = replace(cfg, out=out, **({"concurrency": int(level)} if axis == "concurrency" else {"rate": level}))
        rep = probe_report(run_probe(c), slo=slo)
        rows.append(_row(level, rep, _shares(out), out))
    doc = {"format": FORMAT, "version": VERSION, "axis": axis, "levels": rows, "moved": moved(axis, rows),
           "best_level": best_level(rows) if slo is not None else None}
    write_summary(Path(cfg.out), doc)
    return doc


SUMMARY_FILE = "sweep.json"


def write_summary(out: Path, doc: dict[str, Any]) -> None:
    """The summary as ``OUT/sweep.json`` (what ``report --html OUT`` draws the sweep from)."""
    import json

    try:
        (out / SUMMARY_FILE).write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    except OSError as e:
        raise BadInput(f"{out / SUMMARY_FILE}: cannot write the sweep summary ({e.strerror or e})") from e


def _shares(out: Path) -> dict[str, float]:
    """The measured components' shares of e2e in one level's trace, by the analyzers' attribution."""
    import analyzers

    try:
        doc = analyzers.analyze([out], per_trace=False).to_json()
    except BadInput:  # a level with no request to analyse (all warm-up, or nothing sent)
        return {}
    return {k: v["share"] for k, v in doc["components"].items() if v["measured"] and v["share"] is not None}


def _row(level: float, rep: dict[str, Any], shares: dict[str, float], out: Path) -> dict[str, Any]:
    m = rep["metrics"]
    return {
        "level": level, "trace": str(out), "requests": rep["requests"], "ok": rep["ok"], "failed": rep["failed"],
        "ttft_ms": _pcts(m["ttft_ms"]), "itl_ms": _pcts(m["itl_ms"]), "e2e_ms": _pcts(m["e2e_ms"]),
        "request_throughput": rep["request_throughput"], "output_token_throughput": rep["output_token_throughput"],
        "shares": shares, "bottleneck": max(shares, key=lambda k: shares[k]) if shares else None,
        "client_bound": (rep.get("client") or {}).get("client_bound"),
        "slo": rep.get("slo"),
    }


def _pcts(s: dict[str, Any]) -> dict[str, Any]:
    return {k: s.get(k) for k in ("p50", "p90", "p99")}


def moved(axis: str, rows: list[dict[str, Any]]) -> str | None:
    """One line: the component whose share moved most from the first level to the last, and the
    bottleneck at each end when it changed."""
    if len(rows) < 2:
        return None
    first, last = rows[0], rows[-1]
    common = [k for k in first["shares"] if k in last["shares"]]
    if not common:
        return ("e2e p50 " + ", ".join(f"{units.ms(r['e2e_ms']['p50'], 1, unit=False)} ms at {level_name(r['level'])}"
                                       for r in rows)
                + "; where the time went is not measured (the server reports no timings, and no request "
                "waited in the client)")
    k = max(common, key=lambda c: abs(last["shares"][c] - first["shares"][c]))
    said = f"{k} share " + ", ".join(f"{_pct(r['shares'].get(k))} at {level_name(r['level'])}" for r in rows)
    if first["bottleneck"] != last["bottleneck"]:
        said += (f"; the bottleneck moved from {first['bottleneck']} at {axis} {level_name(first['level'])} "
                 f"to {last['bottleneck']} at {level_name(last['level'])}")
    else:
        said += f"; {last['bottleneck']} stays the bottleneck"
    return said


def best_level(rows: list[dict[str, Any]]) -> float | None:
    """The highest level whose every SLO held (attainment 1 per the SLO's rule), else None."""
    good = [r["level"] for r in rows if r.get("slo") and r["slo"]["met"]]
    return max(good) if good else None


def _pct(x: float | None) -> str:
    return NOT_MEASURED if x is None else f"{x * 100:.0f} %" if x >= 0.1 else f"{x * 100:.1f} %"


def print_sweep(doc: dict[str, Any]) -> None:
    axis = doc["axis"]
    comps = list(dict.fromkeys(k for r in doc["levels"] for k in r["shares"]))
    head = [axis, "ok", "TTFT p50", "TTFT p99", "ITL p50", "e2e p50", "e2e p99", "req/s", "tok/s", *comps]
    rows = []
    for r in doc["levels"]:
        rows.append([level_name(r["level"]), f"{r['ok']}/{r['requests']}", units.ms(r["ttft_ms"]["p50"], 1, unit=False),
                     units.ms(r["ttft_ms"]["p99"], 1, unit=False), units.ms(r["itl_ms"]["p50"], 1, unit=False),
                     units.ms(r["e2e_ms"]["p50"], 1, unit=False), units.ms(r["e2e_ms"]["p99"], 1, unit=False),
                     _f(r["request_throughput"], 2), _f(r["output_token_throughput"], 1),
                     *[_pct(r["shares"].get(k)) for k in comps]])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    for line in [head, *rows]:
        echo("  ".join(str(x).rjust(w) for x, w in zip(line, widths, strict=True)))
    if doc["moved"]:
        echo(f"where it moved: {doc['moved']}")
    for r in doc["levels"]:
        if r["client_bound"]:
            echo(f"{axis} {level_name(r['level'])}: client-bound: {r['client_bound']}")
    if any(r.get("slo") for r in doc["levels"]):
        best = doc["best_level"]
        echo(f"highest {axis} meeting the SLOs: {level_name(best) if best is not None else 'none'}")


def _f(x: float | None, d: int) -> str:
    return NOT_MEASURED if x is None else f"{x:.{d}f}"
