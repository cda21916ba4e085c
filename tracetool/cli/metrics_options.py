"""``--metrics-url`` and ``--metrics-interval``: scrape a server's Prometheus metrics into the trace.

Shared by ``probe``, ``record``, ``serve`` and ``attach --record`` (docs/serving.md, "Engine
metrics"); the scraper itself is :mod:`collectors.prometheus`. The interval's default is the
probe's (``ProbeConfig.metrics_interval_s``), like every other probe option's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from tracetool.serving.probe_types import default

F = TypeVar("F", bound=Callable[..., Any])


def metrics_options(auto: bool) -> Callable[[F], F]:
    """The two options; ``auto`` says whether ``--metrics-url auto`` (the endpoint's origin +
    /metrics) makes sense for the command (it does where the command is given the server's URL)."""

    def deco(fn: F) -> F:
        fn = click.option("--metrics-interval", "metrics_interval", type=click.FloatRange(0.05, 3600),
                          default=default("metrics_interval_s"), show_default=True,
                          help="Seconds between two scrapes of --metrics-url.")(fn)
        what = ("URL, or 'auto' for the server's origin + /metrics" if auto else "URL")
        fn = click.option("--metrics-url", "metrics_url", metavar="URL|auto" if auto else "URL", default=None,
                          help=f"Scrape the server's Prometheus metrics ({what}) during the run into the "
                               "trace's server_metrics table: requests waiting and running, KV-cache usage, "
                               "queue/prefill/decode time (docs/serving.md, 'Engine metrics').")(fn)
        return fn

    return deco
