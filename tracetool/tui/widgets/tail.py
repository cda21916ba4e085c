"""One metric's tail against its typical requests: where the extra time is, and what the tail has in common."""

from __future__ import annotations

from typing import Any

from textual.content import Content
from textual.widget import Widget

from tracetool.glyphs import NOT_MEASURED
from tracetool.schema import OPTIONAL_COMPONENTS
from tracetool.tui import fmt

NAME_W, MS_W, SHARE_W, FEATURES, LABEL_W = 14, 10, 9, 4, 34
_EIGHTHS = " ▏▎▍▌▋▊▉█"


class TailPanel(Widget):
    """The analysis' ``tail`` object for one metric (docs/analysis-json.md): the tail explained (above p99,
    else p95) against the typical requests (p40-p60); per component its mean in each group, the difference
    and a bar of its share of the gap ("not measured" for what no request measured: unknown, not zero);
    then the features that separate the tail most, with their effect sizes and group sizes."""

    def __init__(self, metric: str, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.metric = metric
        self._tail: dict[str, Any] | None = None

    def show(self, tail: dict[str, Any] | None) -> None:
        self._tail = tail
        self.refresh(layout=True)

    def get_content_height(self, container: Any, viewport: Any, width: int) -> int:
        # the sentence wraps; the table rows are cut to the width
        return sum(len(line.wrap(width)) if i == 0 else 1 for i, line in enumerate(self._lines(width)))

    def render(self) -> Content:
        width = self.size.width
        lines = self._lines(width)
        return Content("\n").join([*lines[:1], *(line.truncate(width) for line in lines[1:])])

    def _lines(self, width: int) -> list[Content]:
        t = self._tail
        if not t:
            return [Content.styled("not measured", "$text-muted italic")]
        level = t.get("explained")
        lines = [Content.styled(fmt.text(t.get("sentence") or ""), "$text-muted")]
        if level is None:
            return lines
        group = t.get(level) or {}
        unit = "per gap" if self.metric == "itl" else "per token" if self.metric == "tpot" else "per request"
        lines.append(Content.styled(f"{'':<{NAME_W}}{'typical':>{MS_W}}{level + ' tail':>{MS_W}}{'change':>{MS_W}}"
                                    f"{'of gap':>{SHARE_W}}  ({unit})", "$text-muted"))
        bar_w = max(4, width - NAME_W - 3 * MS_W - SHARE_W - 3)
        for name, c in (group.get("components") or {}).items():
            if name in OPTIONAL_COMPONENTS and not c.get("measured"):
                continue  # only some traces can measure them (as the overview's waterfall)
            if not c.get("measured"):
                lines.append(Content.assemble(f"{name:<{NAME_W}}",
                                              (f"{'not measured':>{MS_W * 2}}", "$text-muted italic")))
                continue
            share = c.get("gap_share")
            top = name == t.get("top_component")
            style = "$text-warning" if top else "$text-primary"
            delta = c.get("delta_ms")
            lines.append(Content.assemble((f"{name:<{NAME_W}}", "bold" if top else ""),
                                          f"{fmt.ms(c.get('typical_ms')):>{MS_W}}",
                                          f"{fmt.ms(c.get('tail_ms')):>{MS_W}}",
                                          f"{('+' if delta and delta > 0 else '') + fmt.ms(delta):>{MS_W}}",
                                          f"{fmt.pct(share):>{SHARE_W}}  ", (_bar(share, bar_w), style)))
        feats = group.get("features")
        if feats:
            lines.append(Content.styled(f"{'in common':<{LABEL_W}}{'typical':>{MS_W}}{'tail':>{MS_W}}{'ratio':>{MS_W}}"
                                        f"{'δ':>{SHARE_W}}{'p':>{SHARE_W}}", "$text-muted"))
            for f in feats[:FEATURES]:
                median = f["kind"] == "number"
                typ, tail = (f["typical_median"], f["tail_median"]) if median else (f["typical_mean"], f["tail_mean"])
                show = _num if median else fmt.pct
                mark = ("✓ separates", "$text-success") if f["separates"] else ("", "")
                lines.append(Content.assemble(
                    (f"{fmt.fit(f['label'], LABEL_W - 1):<{LABEL_W}}", "bold" if f["separates"] else ""),
                    f"{show(typ):>{MS_W}}", f"{show(tail):>{MS_W}}",
                    f"{NOT_MEASURED if f['ratio'] is None else format(f['ratio'], '.1f') + 'x':>{MS_W}}",
                    f"{_num(f['cliffs_delta'], 2):>{SHARE_W}}", f"{_p(f['p_value']):>{SHARE_W}}  ", mark))
            lines.append(Content.styled(f"{'':<{LABEL_W}}medians (shares for yes/no features) over "
                                        f"{group.get('n')} tail vs {(t.get('typical') or {}).get('n')} typical "
                                        "requests; δ: Cliff's delta", "$text-muted"))
        return lines


def _bar(share: float | None, width: int) -> str:
    if share is None or share <= 0:
        return ""
    eighths = max(1, round(min(share, 1.0) * width * 8))
    full, part = divmod(eighths, 8)
    return "█" * full + (_EIGHTHS[part] if part else "")


def _num(x: float | None, digits: int = 1) -> str:
    if x is None:
        return NOT_MEASURED
    return f"{x:,.0f}" if abs(x) >= 100 and digits < 2 else f"{x:,.{digits}f}"


def _p(p: float | None) -> str:
    if p is None:
        return NOT_MEASURED
    return "<0.001" if p < 0.001 else f"{p:.3f}"


__all__ = ["TailPanel"]
