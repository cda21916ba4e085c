"""``LiveConfig``: the options of a live endpoint, without importing the transport.

The Recorder and the CLI build and check these (bad address, a TLS key without
its certificate: usage errors) before anything starts; the endpoint process
(:mod:`tracetool.live.sidecar`) receives them. Starting an endpoint with them is the
sidecar's (:func:`tracetool.live.sidecar.live_spec`), which imports this module, never the
other way round.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tracetool.errors import UsageError
from tracetool.live.protocol import TOKEN_ENV, Address, parse_address

#: How often the writer flushes while live, by default (``--live-flush-s``). What a flush costs
#: the host (the writer's, the forwarder's and the endpoint process's wake-ups, and the engine's
#: caches they cool) is the same whatever its size, so this sets most of what watching costs:
#: about twice as much at 0.1 s as at 0.2 s (``benchmarks/bench_live_flush.py``, figures in
#: benchmarks/RESULTS.md). 0.2 s is what the viewer redraws at (``attach --refresh-s``).
LIVE_FLUSH_S = 0.2


@dataclass(frozen=True)
class LiveConfig:
    """Options of a live endpoint (``--live HOST:PORT`` and the ``--live-*`` flags).

    Attributes:
        address: ``HOST:PORT`` to bind; ``:PORT`` or ``PORT`` bind 127.0.0.1; port 0 picks one.
        token: the shared token viewers must present; None reads ``$TRACETOOL_LIVE_TOKEN``
            (no token at all: anyone who can reach the port may watch).
        tls_cert, tls_key: PEM certificate chain and private key; both or neither.
        history_s, history_rows: the snapshot a late attacher gets, per table: batches of the
            last ``history_s`` seconds, at most ``history_rows`` rows.
        viewer_buffer_rows: rows queued per table and viewer before new batches are dropped
            (and counted) for that viewer (an empty queue takes one batch of any size).
        max_viewers: viewers streaming at once; more are refused ("too many viewers").
        flush_interval_s: the writer flushes at least this often while live (the floor of
            the display lag; see :data:`LIVE_FLUSH_S`).
        close_timeout_s: how long closing waits for gRPC to end the streams.
    """

    address: str = "127.0.0.1:0"
    token: str | None = None
    tls_cert: str | Path | None = None
    tls_key: str | Path | None = None
    history_s: float = 30.0
    history_rows: int = 1_000_000
    viewer_buffer_rows: int = 250_000
    max_viewers: int = 16
    flush_interval_s: float = LIVE_FLUSH_S
    close_timeout_s: float = 2.0

    @classmethod
    def of(cls, live: str | LiveConfig | Mapping[str, Any]) -> LiveConfig:
        """A config from an address string, a mapping of fields, or a config."""
        if isinstance(live, LiveConfig):
            return live
        if isinstance(live, str):
            return cls(address=live)
        return cls(**dict(live))

    def resolved_token(self) -> str | None:
        return self.token if self.token is not None else (os.environ.get(TOKEN_ENV) or None)

    def check(self) -> Address:
        """Validate address and TLS files (usage errors, before anything starts)."""
        addr = parse_address(self.address)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise UsageError("--live-tls-cert and --live-tls-key go together (give both, or neither)")
        for p in (self.tls_cert, self.tls_key):
            if p is not None and not Path(p).is_file():
                raise UsageError(f"{p}: no such certificate/key file")
        return addr

    def public(self) -> dict[str, Any]:
        """The fields without the token (it travels in the environment, never on a command line)."""
        d = asdict(self)
        d.pop("token")
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


__all__ = ["LIVE_FLUSH_S", "LiveConfig"]
