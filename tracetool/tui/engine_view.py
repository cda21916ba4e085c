"""The engine's state over the run beside the requests in flight: the System screen's engine rows.

Reads ``engine_timeline`` (analyzers/engine.sql: requests waiting and running, KV-cache usage
at each scrape of the server's /metrics) and the requests' own spans on the same clock, both
bucketed over the measured window, and draws them as rows of block heights: the request
timeline first, the engine's rows under it, each labelled with its peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual import work
from textual.content import Content
from textual.message import Message
from textual.widget import Widget
from textual.worker import get_current_worker

from tracetool.tui import fmt
from tracetool.tui.model import View
from tracetool.tui.widgets.strips import resample

BUCKETS = 120
_BLOCKS = " ▁▂▃▄▅▆▇█"  # heights, as the other strips
ROWS = (("in flight", "$text-accent"), ("waiting", "$text-warning"), ("running", "$text-primary"),
        ("KV usage", "$text-error"))
LABEL_W = 18


@dataclass
class EngineData:
    """Per bucket of the window: requests in flight (from spans) and the engine's gauges."""

    window_s: float = 0.0
    rows: dict[str, list[float | None]] = field(default_factory=dict)


def engine_data(view: View, buckets: int = BUCKETS) -> EngineData:
    """Bucket the engine's timeline and the requests in flight over ``engine_window``."""
    a = view.analysis
    w = a.query("SELECT clock, start_ns, end_ns FROM engine_window WHERE trace = ?", [view.label]) \
        if view.label != "all" else a.query("SELECT clock, start_ns, end_ns FROM engine_window LIMIT 1")
    if w.num_rows == 0:
        return EngineData()
    clock, lo, hi = (w.column(c)[0].as_py() for c in ("clock", "start_ns", "end_ns"))
    trace = (view.label if view.label != "all"
             else a.query("SELECT trace FROM engine_window LIMIT 1").column(0)[0].as_py())
    width = max(1, -(-(int(hi) - int(lo) + 1) // buckets))
    out = EngineData(window_s=(hi - lo) / 1e9)
    tl = a.query("SELECT (ts_ns - ?) // ? AS b, max(requests_waiting) AS w, max(requests_running) AS r, "
                 "max(kv_cache_usage) AS kv FROM engine_timeline WHERE trace = ? AND ts_ns BETWEEN ? AND ? "
                 "GROUP BY ALL", [lo, width, trace, lo, hi]).to_pylist()
    for key, col in (("waiting", "w"), ("running", "r"), ("KV usage", "kv")):
        vals: list[float | None] = [None] * buckets
        for row in tl:
            if row[col] is not None:
                vals[min(int(row["b"]), buckets - 1)] = float(row[col])
        if any(v is not None for v in vals):
            out.rows[key] = _hold(vals)
    name = "client.request" if clock == "client" else "server.request"
    spans = a.query("SELECT start_ns, end_ns FROM spans WHERE trace = ? AND name = ? AND clock = ?",
                    [trace, name, clock]).to_pylist()
    if spans:
        flight = [0.0] * buckets
        for s in spans:
            first = max(0, (int(s["start_ns"]) - lo) // width)
            last = min(buckets - 1, (int(s["end_ns"]) - lo) // width)
            for b in range(first, last + 1):
                flight[b] += 1
        out.rows["in flight"] = list(flight)
    return out


def _hold(vals: list[float | None]) -> list[float | None]:
    """A gauge holds its value until the next scrape: fill buckets between scrapes."""
    out: list[float | None] = []
    last: float | None = None
    for v in vals:
        last = v if v is not None else last
        out.append(last)
    return out


class EngineStrips(Widget):
    """The engine rows; loads its data on a worker thread and draws when it arrives."""

    class Loaded(Message):
        def __init__(self, data: EngineData | None, error: str = "") -> None:
            super().__init__()
            self.data, self.error = data, error

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.data: EngineData | None = None
        self.error = ""

    def load(self, view: View) -> None:
        self._load(view)

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def _load(self, view: View) -> None:
        try:
            data = engine_data(view)
        except Exception as e:
            self.post_message(self.Loaded(None, f"{type(e).__name__}: {e}"))
            return
        if not get_current_worker().is_cancelled:
            self.post_message(self.Loaded(data))

    def on_engine_strips_loaded(self, message: Loaded) -> None:
        self.data, self.error = message.data, message.error
        self.refresh(layout=True)

    def get_content_height(self, container: Any, viewport: Any, width: int) -> int:
        return max(1, len(self.data.rows) + 1) if self.data else 1

    def render(self) -> Content:
        if self.error:
            return Content.styled(fmt.text(self.error), "$text-error")
        d = self.data
        if d is None or not d.rows:
            return Content.styled("no engine samples in the window", "$text-muted")
        cols = max(1, self.size.width - LABEL_W)
        lines = []
        for label, style in ROWS:
            vals = d.rows.get(label)
            if vals is None:
                continue
            peak = max((v for v in vals if v is not None), default=0.0)
            scale = 1.0 if label == "KV usage" else (peak or 1.0)
            cells = "".join(_BLOCKS[round(v * 8)] for v in resample([(v or 0.0) / scale for v in vals], cols))
            top = f"{peak * 100:.0f}%" if label == "KV usage" else f"{peak:.0f}"
            lines.append(Content.assemble((f"{label:<10}{'max ' + top:>7} ", "$text-muted"), (cells, style)))
        lines.append(Content.styled(f"{'':<{LABEL_W}}0{f'{d.window_s:.1f} s':>{cols - 1}}", "$text-muted"))
        return Content("\n").join(lines)


def engine_note(engine: dict[str, Any]) -> Content:
    """One line over the rows: the source, the scrapes, the window aggregates the findings use;
    the queue time's percentiles as bounded as its buckets allow (tracetool.glyphs)."""
    from tracetool.glyphs import bucketed_percentiles

    q = engine.get("queue_time_ms") or {}
    kv = engine.get("kv_cache_usage") or {}
    parts: list[str | tuple[str, str]] = [
        f"{fmt.text(engine.get('source') or 'unknown engine')} · {fmt.count(engine.get('scrapes'))} scrapes "
        f"({engine.get('clock')} clock) · waiting max ",
        (fmt.num((engine.get("requests_waiting") or {}).get("max"), 0), "bold"),
        " · KV max ", (fmt.pct(kv.get("max")), "bold"), " · queue mean ", (fmt.ms(q.get("mean")), "bold")]
    if q.get("bucketed") and any(q.get(k) is not None for k in ("p50", "p95", "p50_max", "p95_max")):
        parts.append(", " + bucketed_percentiles(q, fmt.ms))
    parts += [" · preemptions ", (fmt.count(engine.get("preemptions")), "bold")]
    return Content.assemble(*parts)


__all__ = ["EngineData", "EngineStrips", "engine_data", "engine_note"]
