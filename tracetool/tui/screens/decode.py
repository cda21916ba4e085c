"""Decode: ITL over the token index and against kv_len, with the fit and the roofline; the two tok/s figures."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from textual import work
from textual.containers import VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static
from textual.worker import get_current_worker

from tracetool import units
from tracetool.glyphs import NOT_MEASURED
from tracetool.tui import fmt
from tracetool.tui.model import View
from tracetool.tui.queries import DecodeData, decode_data
from tracetool.tui.screens.base import TraceScreen
from tracetool.tui.widgets.braille import BraillePlot, Series
from tracetool.tui.widgets.rates import Rates


class DecodeScreen(TraceScreen):
    """The decode figures; the per-token plots are binned by a worker (one pass over the tokens)."""

    MODE = "decode"

    class Loaded(Message):
        def __init__(self, key: tuple[int, str], data: DecodeData | None, error: str = "") -> None:
            super().__init__()
            self.key, self.data, self.error = key, data, error

    def compose_body(self) -> Iterable[Widget]:
        with VerticalScroll(id="decode"):
            yield Static("Per-request vs aggregate tokens/s", classes="section")
            yield Rates(id="rates")
            yield Static("ITL over token index", classes="section", id="index-title")
            yield BraillePlot(id="itl-index", classes="plot")
            yield Static("ITL against kv_len", classes="section", id="kv-title")
            yield BraillePlot(id="itl-kv", classes="plot")
            yield Static("", id="fit-text")

    def show_view(self, view: View) -> None:
        d = view.doc.get("decode") or {}
        self.query_one(Rates).show(d)
        self.query_one("#fit-text", Static).update(_fit_text(d))
        for plot in self.query(BraillePlot):
            plot.plot([], empty="binning tokens…")
        gen = self.trace_app.snapshot.generation if self.trace_app.snapshot else 0
        self._load(view, (gen, view.label))

    @work(thread=True, exclusive=True, group="decode", exit_on_error=False)
    def _load(self, view: View, key: tuple[int, str]) -> None:
        try:
            data = decode_data(view)
        except Exception as e:  # shown on the screen, never a traceback
            self.post_message(self.Loaded(key, None, f"{type(e).__name__}: {e}"))
            return
        if not get_current_worker().is_cancelled:
            self.post_message(self.Loaded(key, data))

    def on_decode_screen_loaded(self, message: Loaded) -> None:
        view = self.trace_app.current_view()
        snap = self.trace_app.snapshot
        if view is None or snap is None or message.key != (snap.generation, view.label):
            return  # a newer snapshot is on its way
        by_index, by_kv = self.query_one("#itl-index", BraillePlot), self.query_one("#itl-kv", BraillePlot)
        if message.data is None:
            by_index.plot([], empty=f"could not bin tokens: {fmt.text(message.error)}")
            by_kv.plot([], empty="")
            return
        data = message.data
        decode = view.doc.get("decode") or {}
        itl = view.doc.get("itl_ms") or {}
        self.query_one("#index-title", Static).update(
            f"ITL over token index · p50 and p90 per bin · {fmt.count(data.tokens)} tokens · "
            f"clock {itl.get('clock') or NOT_MEASURED}")
        top = max([p90 for _, _, p90 in data.by_index] or [1.0]) * 1.1
        by_index.plot([Series("p90", [(x, p90) for x, _, p90 in data.by_index], "$text-warning"),
                       Series("p50", [(x, p50) for x, p50, _ in data.by_index], "$text-primary")],
                      x_range=(1, max([x for x, _, _ in data.by_index] or [1])), y_range=(0, top),
                      caption="x: token index · y: ms", empty="no decode tokens")
        what = "step time" if data.basis == "step" else "server-side ITL"
        self.query_one("#kv-title", Static).update(
            f"{what.capitalize()} against kv_len · tokens (cells with ≥1 % of their column), median, fit, roofline")
        series = _kv_series(data, decode)
        lines = [y for sr in series if sr.kind == "line" for _, y in sr.points]
        kv_top = min(max([data.y_max, *lines]), 2 * data.y_max) if data.y_max else None
        by_kv.plot(series, x_range=data.kv_range, y_range=(0, kv_top) if kv_top else None,
                   caption="x: kv_len (tokens) · y: ms", empty="no decode token carries kv_len")


def _kv_series(data: DecodeData, decode: dict[str, Any]) -> list[Series]:
    if data.kv_range is None:
        return []
    lo, hi = data.kv_range
    dots, median = _density(data.density)
    series = [Series("tokens", dots, "$text-success", "points"), Series("median", median, "")]
    fit, roof = decode.get("fit"), decode.get("roofline")
    if fit and fit.get("per_1k_kv_ms") is not None:
        series.append(Series("fit", _line(fit["base_ms"], fit["per_1k_kv_ms"], lo, hi), "$text-primary"))
    if roof and roof.get("ideal_base_ms") is not None and roof.get("ideal_per_1k_kv_ms") is not None:
        series.append(Series("roofline ideal", _line(roof["ideal_base_ms"], roof["ideal_per_1k_kv_ms"], lo, hi),
                             "$text-warning"))
    return series


def _density(cells: list[tuple[float, float, int]], floor: float = 0.01
             ) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Cells holding at least ``floor`` of their kv_len column's tokens (stray outliers would
    otherwise paint a solid block), and the column's median, read off the binned counts."""
    columns: dict[float, list[tuple[float, int]]] = {}
    for kv, ms, n in cells:
        columns.setdefault(kv, []).append((ms, n))
    dots, median = [], []
    for kv in sorted(columns):
        col = sorted(columns[kv])
        total = sum(n for _, n in col)
        dots += [(kv, ms) for ms, n in col if n >= floor * total]
        seen = 0
        for ms, n in col:
            seen += n
            if seen * 2 >= total:
                median.append((kv, ms))
                break
    return dots, median


def _line(base: float, per_1k: float, lo: float, hi: float, n: int = 64) -> list[tuple[float, float]]:
    return [(x, base + per_1k * x / 1000) for x in (lo + (hi - lo) * i / (n - 1) for i in range(n))]


def _fit_text(d: dict[str, Any]) -> Content:
    fit, roof = d.get("fit"), d.get("roofline")
    parts: list[str | tuple[str, str]] = []
    if fit:
        sign = "-" if (fit.get("per_1k_kv_ms") or 0) < 0 else "+"
        r2 = NOT_MEASURED if fit.get("r2") is None else f"{fit['r2']:.2f}"
        parts += ["fit  ", (f"{fit['basis']} = {fmt.ms(fit['base_ms'], 2)} {sign} "
                            f"{units.ms(abs(fit['per_1k_kv_ms']), 3)} per 1k kv_len", "bold"),
                  (f"  r² {r2} · {fmt.count(fit.get('n'))} tokens · kv_len {fmt.count(fit.get('kv_len_min'))}"
                   f"–{fmt.count(fit.get('kv_len_max'))}", "$text-muted")]
    else:
        parts += [("no fit: fewer than 3 decode tokens carry kv_len, or kv_len does not vary", "$text-muted")]
    if roof:
        parts += ["\nroofline  ideal ", (f"{fmt.ms(roof.get('ideal_base_ms'), 2)} + "
                                         f"{units.ms(roof.get('ideal_per_1k_kv_ms') or 0, 3)} per 1k kv_len", "bold"),
                  f" at batch {roof.get('batch_mean') or 1:,.1f} ({fmt.text(roof.get('model'))} on "
                  f"{roof.get('gpu_count')}× {fmt.text(roof.get('gpu'))})",
                  "\n          measured ", (fmt.ms(roof.get("measured_step_ms"), 2), "bold"), " vs ideal ",
                  (fmt.ms(roof.get("ideal_step_ms"), 2), "bold"), " = ",
                  (fmt.pct(roof.get("bandwidth_efficiency")), "bold"), " of peak bandwidth · compute/memory ",
                  (f"{roof.get('compute_to_memory') or 0:.2f}×", "bold")]
    else:
        parts += [("\nno roofline: " + fmt.text(d.get("roofline_note") or "model or GPU unknown")
                   + " (pass --model and --gpu)", "$text-muted")]
    return Content.assemble(*parts)


__all__ = ["DecodeScreen"]
