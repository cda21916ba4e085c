"""Live attach: stream a recording process's trace to viewers while it is written.

* :mod:`tracetool.live.server` — the endpoint a recording process runs
  (``Recorder(..., live="127.0.0.1:PORT")``, ``tracetool serve/record --live``):
  an Arrow Flight server fed by the :class:`~tracetool.writer.TraceWriter`'s
  batch listener, one stream of record batches per table, a bounded snapshot
  of recent history for late attachers, bounded per-viewer buffers.
* :mod:`tracetool.live.client` — one connection per server, reconnecting
  with backoff, tables received as record batches.
* :mod:`tracetool.live.window` — the sliding window (last N seconds, last N
  requests) a viewer analyses.
* :mod:`tracetool.live.source` — :class:`LiveSource`, the
  :class:`~tracetool.source.TraceSource` of ``tracetool attach``.
* :mod:`tracetool.live.headless` — ``tracetool attach --record``: a live
  stream saved as a v1 trace.

This package is on headless paths: nothing here imports textual or DuckDB, and
``pyarrow.flight`` is imported only by the modules that talk to the network.
docs/live.md is the user's page.
"""

from __future__ import annotations

from tracetool.live.protocol import TOKEN_ENV, Address, parse_address

__all__ = ["TOKEN_ENV", "Address", "parse_address"]
