"""Live attach: stream a recording process's trace to viewers while it is written.

* :mod:`tracetool.live.sidecar` — what ``Recorder(..., live="127.0.0.1:PORT")``
  (``tracetool serve/record --live``) starts: a tap on the
  :class:`~tracetool.writer.TraceWriter`'s batches feeding, through a bounded
  queue and a pipe, an endpoint process of its own;
* :mod:`tracetool.live.server` — that endpoint: an Arrow Flight server, one
  stream of record batches per table, a bounded history snapshot for late
  attachers, bounded per-viewer queues with counted drops, token and TLS;
* :mod:`tracetool.live.client` — one connection per server, reconnecting
  with backoff, tables received as record batches;
* :mod:`tracetool.live.window` — the sliding window (last N seconds, last N
  requests) a viewer analyses;
* :mod:`tracetool.live.source` — :class:`~tracetool.live.source.LiveSource`,
  the :class:`~tracetool.trace_source.TraceSource` of ``tracetool attach``;
* :mod:`tracetool.live.headless` — ``tracetool attach --record``: a live
  stream saved as a v1 trace;
* :mod:`tracetool.live.config`, :mod:`tracetool.live.protocol` — options,
  addresses, tickets, metadata (no pyarrow: the CLI parses with them).

This package is on headless paths: nothing here imports textual or DuckDB, and
``pyarrow.flight`` is imported only by the modules that talk to the network
(never by a recording host). docs/live.md is the user's page.
"""

from __future__ import annotations

from tracetool.live.protocol import TOKEN_ENV, Address, parse_address

__all__ = ["TOKEN_ENV", "Address", "parse_address"]
