"""Imported before ``pyarrow.flight`` starts gRPC: keep gRPC's INFO log lines off stderr.

gRPC core logs every failed TLS handshake (and more) at INFO straight to file
descriptor 2, which would scribble over the TUI and break "one line on
stderr". ``GRPC_VERBOSITY`` is read when gRPC initialises; a value the user
set is kept.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
