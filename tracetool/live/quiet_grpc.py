"""Imported before ``pyarrow.flight`` starts gRPC: keep gRPC's INFO log lines off stderr.

gRPC core logs every failed TLS handshake at INFO and a port it cannot bind
at ERROR, straight to file descriptor 2: that would scribble over the TUI
and break "one line on stderr". Every failure reaches tracetool as a Flight
error anyway, and is said there in one line. ``GRPC_VERBOSITY`` is read when
gRPC initialises; a value the user set is kept.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_VERBOSITY", "NONE")
