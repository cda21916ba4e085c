"""``LiveSource``: live servers as a :class:`~tracetool.trace_source.TraceSource` (``tracetool attach``).

One :class:`~tracetool.live.client.ServerConnection` and one
:class:`~tracetool.live.window.ServerWindow` per address. ``snapshot()``
returns each server's sliding window as a :class:`~tracetool.reader.Trace`
(its ``path.name`` is the address, so the viewer shows every server alone and
all of them together); ``status()`` is the header line: per server its state,
tokens received, tokens/s, and drops — it changes with every batch, so the
viewer can redraw it at ``refresh_s`` without re-analysing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from tracetool.errors import BadInput
from tracetool.live.client import CONNECTED, REFUSED, ClientOptions, ServerConnection
from tracetool.live.protocol import Address, parse_address
from tracetool.live.window import ServerWindow, WindowSpec
from tracetool.reader import Trace
from tracetool.trace_source import SourceDefaults

#: What ``w`` in the viewer cycles through (seconds; None = requests only / everything kept).
WINDOW_STEPS: tuple[float | None, ...] = (10.0, 30.0, 60.0, 300.0)


class LiveSource(SourceDefaults):
    """Live servers, their sliding windows and connection states.

    Args:
        addresses: ``HOST:PORT`` of each server's live endpoint.
        options: token, TLS, backoff.
        window: what a snapshot covers (last N seconds / last N requests).
        refresh_s: how often the viewer takes a snapshot (0.2: 5 Hz).
    """

    live = True

    def __init__(self, addresses: Iterable[str | Address], *, options: ClientOptions | None = None,
                 window: WindowSpec | None = None, refresh_s: float = 0.2) -> None:
        self.addresses = [a if isinstance(a, Address) else parse_address(a, option="ADDR") for a in addresses]
        if not self.addresses:
            raise BadInput("no live address given")
        self.options = options or ClientOptions()
        self.spec = window or WindowSpec()
        self.refresh_s = refresh_s
        labels = _labels(self.addresses)
        self.windows = [ServerWindow(label, self.spec) for label in labels]
        self.connections = [ServerConnection(a, self._hello, self._batch, self.options) for a in self.addresses]
        self._by_conn = {id(c): w for c, w in zip(self.connections, self.windows, strict=True)}
        self._started = False
        self._lock = threading.Lock()

    # -- TraceSource ---------------------------------------------------------------------------
    @property
    def label(self) -> str:
        return ", ".join(w.label for w in self.windows)

    def start(self) -> LiveSource:
        if not self._started:
            self._started = True
            for c in self.connections:
                c.start()
        return self

    def snapshot(self) -> list[Trace]:
        """Each server's window with at least one request in it (``[]`` until data arrives)."""
        self.start()
        out = []
        for c, w in zip(self.connections, self.windows, strict=True):
            w.dropped = c.dropped
            t = w.trace()
            if t is not None:
                out.append(t)
        return out

    def status(self) -> str:
        """One line: per server its state and figures, then the window."""
        parts = []
        for c, w in zip(self.connections, self.windows, strict=True):
            head = f"{w.label}: " if len(self.windows) > 1 else ""
            text = c.status()
            if c.state == CONNECTED or w.tokens_total:
                text += f" · {w.tokens_total:,} tokens · {_rate(w.tokens_per_s())} tok/s"
            dropped = sum(c.dropped.values())
            if dropped:
                text += f" · {dropped:,} rows dropped"
            if c.gaps:
                text += f" · {c.gaps} batches missed"
            parts.append(head + text)
        return " │ ".join(parts) + f" │ window {self.spec.describe()}"

    def close(self) -> None:
        for c in self.connections:
            c.stop()

    # -- window controls -----------------------------------------------------------------------
    def set_window(self, spec: WindowSpec) -> None:
        self.spec = spec
        for w in self.windows:
            w.set_spec(spec)

    def cycle_window(self) -> str:
        """Next time window of :data:`WINDOW_STEPS` (the viewer's ``w`` key); returns its description."""
        cur = self.spec.seconds
        steps = list(WINDOW_STEPS)
        i = steps.index(cur) if cur in steps else -1
        nxt = steps[(i + 1) % len(steps)]
        from dataclasses import replace

        self.set_window(replace(self.spec, seconds=nxt))
        return self.spec.describe()

    # -- start-up checks -----------------------------------------------------------------------
    def wait_first(self, timeout: float) -> None:
        """Wait until every server answered once (or ``timeout``).

        Raises:
            BadInput: a server refused the token, or TLS failed (exit 3 before any UI starts); an
                unreachable server is not an error (it is retried, and shown as disconnected).
        """
        self.start()
        deadline = time.monotonic() + timeout
        for c in self.connections:
            c.first_outcome.wait(max(0.0, deadline - time.monotonic()))
        refused = [c for c in self.connections if c.state == REFUSED]
        if refused:
            c = refused[0]
            raise BadInput(f"{c.address}: refused: {c.reason} (give the server's token with --token or "
                           "$TRACETOOL_LIVE_TOKEN)")
        tls = [c for c in self.connections if c.state != CONNECTED and "TLS" in c.reason]
        if tls:  # retrying cannot fix a TLS mismatch: say so before drawing
            raise BadInput(f"{tls[0].address}: {tls[0].reason}")

    @property
    def dropped(self) -> dict[str, dict[str, int]]:
        """Per server, rows the live stream dropped for this viewer, per table."""
        return {w.label: c.dropped for c, w in zip(self.connections, self.windows, strict=True)}

    # -- callbacks from the connections -----------------------------------------------------------
    def _hello(self, conn: ServerConnection, hello: dict[str, Any], new: bool) -> None:
        self._by_conn[id(conn)].set_hello(hello, new)

    def _batch(self, conn: ServerConnection, table: str, batch: pa.RecordBatch) -> None:
        self._by_conn[id(conn)].add(table, batch)


def _labels(addresses: Sequence[Address]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for a in addresses:
        base = str(a)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.append(base if n == 0 else f"{base}#{n + 1}")
    return out


def _rate(x: float) -> str:
    if x >= 10_000:
        return f"{x / 1000:,.0f}k"
    return f"{x:,.0f}"


__all__ = ["WINDOW_STEPS", "LiveSource"]
