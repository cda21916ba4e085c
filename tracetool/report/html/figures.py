"""Figures as inline SVG, drawn by matplotlib's SVG back end (the ``html`` extra).

matplotlib is imported here only, and only when a figure is drawn (:func:`require` first
says in one line when it is missing), so nothing else of tracetool loads it. Every figure is a
:class:`matplotlib.figure.Figure` of its own (no pyplot, no global state), saved with text as
text (``svg.fonttype: none``: no embedded glyphs, the reader's own fonts), a fixed hash salt
and no date, so the same data gives the same bytes. Text and axes are drawn in placeholder
colours that become CSS variables (``var(--fg)``), so one SVG reads on the light and the dark
page; the ids inside each SVG get a prefix of their own, so figures inlined side by side never
share one.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tracetool.errors import UsageError

#: Placeholder colours, replaced by the page's CSS variables after drawing.
FG, MUTED, GRID = "#010203", "#040506", "#070809"
_CSS_COLOURS = {FG: "var(--fg)", MUTED: "var(--muted)", GRID: "var(--rule)"}
#: One colour per component, the same in every figure (Okabe-Ito first: readable on both themes).
COMPONENT_COLOURS = {
    "client_queue": "#8c8c8c", "network": "#e69f00", "frontend": "#cc79a7", "queue": "#d55e00",
    "tokenize": "#009e73", "preprocess": "#56b4e9", "prefill": "#0072b2", "decode": "#7b61ff",
    "detokenize": "#44aa99", "postprocess": "#aa4499", "other": "#b0a060",
}
LINE = "#0072b2"
ACCENT = "#d55e00"
SECOND = "#009e73"
#: Width of a figure in inches at 100 dpi: 8.6 in is the page's figure column at full width.
WIDTH = 8.6
INSTALL = "pip install 'tracetool-llm[html]'"


def require() -> None:
    """Raise :class:`UsageError` (exit 2, one line) when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise UsageError(f"--html needs matplotlib, which is not installed ({INSTALL})") from e


def _rc() -> Any:  # matplotlib's own type names every key
    return {
        "svg.fonttype": "none", "svg.hashsalt": "tracetool", "text.parse_math": False,
        "font.family": ["sans-serif"], "font.size": 9,
        "text.color": FG, "axes.labelcolor": FG, "axes.edgecolor": MUTED, "xtick.color": MUTED,
        "ytick.color": MUTED, "xtick.labelcolor": FG, "ytick.labelcolor": FG, "grid.color": GRID,
        "axes.grid": True, "grid.linewidth": 0.6, "axes.axisbelow": True,
        "axes.spines.top": False, "axes.spines.right": False,
        "figure.facecolor": "none", "axes.facecolor": "none", "savefig.facecolor": "none",
        "legend.frameon": False, "legend.fontsize": 8, "axes.titlesize": 10, "axes.titleweight": "bold",
        "axes.prop_cycle": _cycler(),
    }


def _cycler() -> Any:
    from cycler import cycler

    return cycler(color=[LINE, ACCENT, SECOND, "#cc79a7", "#e69f00", "#56b4e9", "#7b61ff"])


@contextmanager
def figure(height: float, ncols: int = 1, nrows: int = 1, **kw: Any) -> Iterator[tuple[Any, Any]]:
    """A new figure and its axes (an array when there are several), under the page's style."""
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(_rc()):
        fig = Figure(figsize=(WIDTH, height), dpi=100, layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=True, **kw)
        yield fig, axes


_ID = re.compile(r'(id="|url\(#|href="#)([^")]+)')


def svg(fig: Any, name: str, title: str) -> str:
    """The figure as one inline ``<svg>`` element: no XML prolog, ids prefixed with ``name``,
    placeholder colours as CSS variables, and a title for screen readers."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context(_rc()):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"\s*<metadata>.*?</metadata>", "", text, flags=re.S)
    text = _ID.sub(lambda m: f"{m.group(1)}{name}-{m.group(2)}", text)
    for placeholder, css in _CSS_COLOURS.items():
        text = text.replace(placeholder, css)
    # the reader's fonts (svg.fonttype none keeps text as text); matplotlib names the family it used
    text = re.sub(r"font-family:[^;\"]*", "font-family: system-ui, sans-serif", text)
    import html

    head = text.index(">") + 1
    return (text[:head].replace("<svg ", f'<svg role="img" aria-label="{html.escape(title, quote=True)}" ', 1)
            + f"<title>{html.escape(title)}</title>" + text[head:])


def no_data(ax: Any, text: str) -> None:
    """An axes with nothing to draw: says so in its middle, never draws a zero."""
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    for s in ax.spines.values():
        s.set_visible(False)
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color=MUTED)


__all__ = ["ACCENT", "COMPONENT_COLOURS", "FG", "GRID", "INSTALL", "LINE", "MUTED", "SECOND", "figure",
           "no_data", "require", "svg"]
