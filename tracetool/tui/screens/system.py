"""GPU and CPU: NVML series against the decode windows, py-spy categories over time.

Each half hides itself, with a one-line note on how to record it, when the
trace lacks its table.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from textual import work
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static
from textual.worker import get_current_worker

from tracetool.glyphs import NOT_MEASURED
from tracetool.tui import fmt
from tracetool.tui.engine_view import EngineStrips, engine_note
from tracetool.tui.model import View
from tracetool.tui.queries import SystemData, system_data
from tracetool.tui.screens.base import TraceScreen
from tracetool.tui.widgets.braille import Y_LABEL, BraillePlot, Series
from tracetool.tui.widgets.strips import Strips
from tracetool.untrusted import NAME_LIMIT

GPU_STYLES = ("$text-primary", "$text-accent", "$text-success", "$text-warning")
CPU_STYLES = {"model-forward": "$text-primary", "tokenize": "$text-error", "sampling": "$text-accent",
              "detokenize": "$text-warning", "network-io": "$text-success", "idle": "$text-muted"}
PLOTS = (("gpu-sm", "sm", "SM busy %", (0.0, 100.0)), ("gpu-dram", "dram", "DRAM bandwidth %", (0.0, 100.0)),
         ("gpu-mem", "mem", "memory controller %", (0.0, 100.0)), ("gpu-power", "power", "power W", None))


class SystemScreen(TraceScreen):
    """GPU utilisation inside and outside decode, and where the host CPU went."""

    MODE = "system"

    class Loaded(Message):
        def __init__(self, key: tuple[int, str], data: SystemData | None, error: str = "") -> None:
            super().__init__()
            self.key, self.data, self.error = key, data, error

    def compose_body(self) -> Iterable[Widget]:
        with VerticalScroll(id="system"):
            yield Static("GPU (NVML) · aligned with decode windows", classes="section")
            yield Static("", id="gpu-note", classes="note")
            with Vertical(id="gpu-box"):
                for wid, _metric, _title, _rng in PLOTS:
                    yield BraillePlot(id=wid, classes="plot gpu-plot")
                yield Strips(label_width=Y_LABEL, id="decode-band")
            yield Static("CPU (py-spy) · share of samples per category over time", classes="section")
            yield Static("", id="cpu-note", classes="note")
            yield Strips(id="cpu-strips")
            yield Static("Engine (/metrics) · requests in flight, waiting, running, KV-cache usage over the window",
                         classes="section")
            yield Static("", id="engine-note", classes="note")
            yield EngineStrips(id="engine-strips")

    def show_view(self, view: View) -> None:
        doc = view.doc
        has_gpu, has_cpu = doc.get("gpu") is not None, doc.get("cpu") is not None
        self.query_one("#gpu-box").display = has_gpu
        self.query_one("#cpu-strips").display = has_cpu
        self.query_one("#gpu-note", Static).update(_gpu_note(doc) if has_gpu else _absent(
            "gpu", "record with --nvml (tracetool record/serve) to sample NVML"))
        self.query_one("#cpu-note", Static).update(_cpu_note(doc) if has_cpu else _absent(
            "stacks", "record with --pyspy to sample the host CPU"))
        engine = doc.get("engine")
        self.query_one("#engine-strips").display = engine is not None
        self.query_one("#engine-note", Static).update(engine_note(engine) if engine is not None else _absent(
            "server_metrics", "probe with --metrics-url auto to scrape the server's /metrics"))
        if engine is not None:
            self.query_one(EngineStrips).load(view)
        if has_gpu or has_cpu:
            gen = self.trace_app.snapshot.generation if self.trace_app.snapshot else 0
            self._load(view, (gen, view.label))

    @work(thread=True, exclusive=True, group="system", exit_on_error=False)
    def _load(self, view: View, key: tuple[int, str]) -> None:
        try:
            data = system_data(view)
        except Exception as e:
            self.post_message(self.Loaded(key, None, f"{type(e).__name__}: {e}"))
            return
        if not get_current_worker().is_cancelled:
            self.post_message(self.Loaded(key, data))

    def on_system_screen_loaded(self, message: Loaded) -> None:
        view, snap = self.trace_app.current_view(), self.trace_app.snapshot
        if view is None or snap is None or message.key != (snap.generation, view.label):
            return
        data = message.data
        if data is None:
            self.query_one("#gpu-note", Static).update(Content.styled(fmt.text(message.error), "$text-error"))
            return
        span = data.span_s or 1.0
        centre = [(b + 0.5) * data.bucket_ns / 1e9 for b in range(data.buckets)]
        for wid, metric, title, rng in PLOTS:
            plot = self.query_one(f"#{wid}", BraillePlot)
            per_gpu = data.gpu.get(metric)
            plot.display = per_gpu is not None
            if per_gpu is None:
                continue
            series = [Series(f"{title} gpu{g}" if len(per_gpu) > 1 else title,
                             [(x, v) for x, v in zip(centre, vals, strict=True) if v is not None],
                             GPU_STYLES[i % len(GPU_STYLES)]) for i, (g, vals) in enumerate(sorted(per_gpu.items()))]
            plot.plot(series, x_range=(0, span), y_range=rng, caption="x: seconds")
        self.query_one("#decode-band", Strips).show([("decode", data.decode, "$text-warning")])
        rows = [(cat, shares, CPU_STYLES.get(cat, "$text-secondary")) for cat, shares in data.cpu.items()]
        self.query_one("#cpu-strips", Strips).show(rows)


def _absent(table: str, how: str) -> Content:
    return Content.assemble(("not recorded: ", "bold"), (f"this trace has no {table} table; {how}", "$text-muted"))


def _gpu_note(doc: dict[str, Any]) -> Content:
    rows = doc.get("gpu") or []
    step = ((doc.get("host") or {}).get("step_mean_ms") or ((doc.get("decode") or {}).get("roofline") or {})
            .get("measured_step_ms") or (doc.get("itl_ms") or {}).get("p50"))
    coarse = next((f for f in doc.get("findings", []) if f["id"] == "gpu-sampling-coarse"), None)
    parts: list[str | tuple[str, str]] = []
    for r in rows:
        util = r.get("sm_util_decode_pct") if r.get("sm_util_decode_pct") is not None else r.get("gpu_util_decode_pct")
        parts += [f"gpu{r['gpu']}: sampled every ", (fmt.ms(r.get("interval_ms")), "bold"),
                  f" (median), {fmt.count(r.get('decode_samples'))} samples in decode, busy ",
                  (f"{fmt.num(util, 0)} %", "bold"), " during decode\n"]
    if coarse:
        parts += [("! " + fmt.text(coarse["detail"]), "$text-warning")]
    else:
        parts += [(f"sampling is finer than a decode step ({fmt.ms(step)})", "$text-muted")]
    return Content.assemble(*parts)


def _cpu_note(doc: dict[str, Any]) -> Content:
    cats = doc.get("cpu") or []
    busy = [c for c in cats if c.get("category") != "idle"]
    top = ", ".join(f"{fmt.text(c['category'], NAME_LIMIT)} {fmt.pct(c.get('busy_share'))}" for c in busy[:4])
    total = sum(c.get("samples") or 0 for c in cats)
    return Content.assemble(f"{fmt.count(total)} samples · busy: ", (top or NOT_MEASURED, "bold"),
                            ("  (share of non-idle samples)", "$text-muted"))


__all__ = ["SystemScreen"]
