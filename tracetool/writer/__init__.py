"""Streaming trace writer: cheap appends on the caller's thread, Arrow I/O on a background thread.

The package, one concern per module:

* :mod:`~tracetool.writer.interner` — strings as int64 codes for the packed buffers;
* :mod:`~tracetool.writer.sinks` — where a table's rows wait, and their one
  conversion into an Arrow record batch;
* :mod:`~tracetool.writer.stream` — an Arrow IPC stream file, one message per write;
* :mod:`~tracetool.writer.trace_writer` — :class:`TraceWriter`: the sinks, the
  flusher thread, segments, ``meta.json`` and the live listeners.

Everything the rest of the code uses is importable from here.
"""

from __future__ import annotations

from tracetool.writer.interner import Interner
from tracetool.writer.sinks import PackedSink, RowSink, Sink, conform_batch
from tracetool.writer.stream import COMPRESS_MIN_ROWS, StreamFile
from tracetool.writer.trace_writer import QUIET_WAIT_S, Clock, TraceWriter

__all__ = ["COMPRESS_MIN_ROWS", "QUIET_WAIT_S", "Clock", "Interner", "PackedSink", "RowSink", "Sink", "StreamFile",
           "TraceWriter", "conform_batch"]
