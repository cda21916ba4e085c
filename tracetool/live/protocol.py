"""What server and client agree on: addresses, tickets, per-batch metadata, actions.

The transport is Arrow Flight (gRPC). One ``DoGet`` stream per table carries
that table's record batches in its canonical v1 schema; each message's
``app_metadata`` is a small JSON object::

    {"seq": 17, "dropped": 0}          a batch: its sequence number in the table
    {"hb": 1, "dropped": 0}            a heartbeat (a zero-row batch), every HEARTBEAT_S

``dropped`` is the running count of this table's rows the server could not
queue for this viewer (its buffer was full). Two actions answer JSON:
``hello`` (the server's instance id, ``meta.json``, tables, limits) and
``stats`` (rows streamed, viewers, drops, refusals).

A ticket is JSON: ``{"table": "tokens", "viewer": "<id>", "instance": "<id>",
"after": 17, "history": true}``: ``after`` resumes after a sequence number
of the same server instance (a reconnect gets no duplicate), ``history``
asks for the recent-history snapshot first.

No pyarrow.flight import here: the CLI parses addresses before anything heavy.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tracetool.errors import UsageError

#: The environment variable holding the shared token (server and client).
TOKEN_ENV = "TRACETOOL_LIVE_TOKEN"
#: The request header carrying the token: ``authorization: Bearer <token>``.
AUTH_HEADER = "authorization"
#: Tables streamed: every v1 table a recording process writes (clock_offsets is written by
#: ``tracetool merge`` only, never while recording; otlp_spans by ``tracetool receive``, which
#: does not stream). Spelled out so that parsing an address
#: does not import pyarrow; a test keeps it in step with tracetool.schema.TABLES.
STREAMED = ("spans", "tokens", "gpu", "stacks", "steps", "requests", "server_metrics")
#: Seconds between heartbeats on an idle stream.
HEARTBEAT_S = 1.0
#: A stream silent this long (no batch, no heartbeat) is taken for dead.
DEAD_AFTER_S = 5.0

_ADDR_RE = re.compile(r"^(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\[\]\s]*))?:(?P<port>\d{1,5})$")


@dataclass(frozen=True)
class Address:
    """``HOST:PORT`` of a live endpoint (``[::1]:PORT`` for IPv6)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def uri(self, tls: bool) -> str:
        """The Flight location: ``grpc+tcp://`` or ``grpc+tls://``."""
        return f"grpc+{'tls' if tls else 'tcp'}://{self}"


def parse_address(text: str, *, default_host: str = "127.0.0.1", option: str = "--live") -> Address:
    """Parse ``HOST:PORT``, ``:PORT`` or ``PORT`` (host defaults to loopback).

    Raises:
        UsageError: not an address, or a port out of range.
    """
    raw = text.strip()
    if raw.isdigit():
        raw = f":{raw}"
    m = _ADDR_RE.match(raw)
    if not m:
        raise UsageError(f"{option}: {text!r} is not HOST:PORT (e.g. 127.0.0.1:9090)")
    port = int(m.group("port"))
    if port > 65535:
        raise UsageError(f"{option}: port {port} is out of range (0-65535)")
    host = m.group("v6") or m.group("host") or default_host
    return Address(host, port)


def ticket(table: str, viewer: str, *, instance: str | None = None, after: int = -1,
           history: bool = True) -> bytes:
    return json.dumps({"table": table, "viewer": viewer, "instance": instance, "after": after,
                       "history": history}).encode()


def read_ticket(raw: bytes) -> dict[str, Any]:
    """Decode a ticket; raises ValueError when it is not one of ours."""
    doc = json.loads(raw.decode())
    if not isinstance(doc, dict) or doc.get("table") not in STREAMED or not isinstance(doc.get("viewer"), str):
        raise ValueError("not a tracetool live ticket")
    return doc


def batch_meta(seq: int, dropped: int) -> bytes:
    return b'{"seq":%d,"dropped":%d}' % (seq, dropped)


def heartbeat_meta(dropped: int) -> bytes:
    return b'{"hb":1,"dropped":%d}' % dropped


def read_meta(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        doc = json.loads(bytes(raw).decode())
    except (ValueError, UnicodeDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


__all__ = ["AUTH_HEADER", "DEAD_AFTER_S", "HEARTBEAT_S", "STREAMED", "TOKEN_ENV", "Address",
           "batch_meta", "heartbeat_meta", "parse_address", "read_meta", "read_ticket", "ticket"]
