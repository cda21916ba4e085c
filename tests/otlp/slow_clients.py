"""Misbehaving OTLP/HTTP clients on raw sockets: slowloris headers and bodies, idle connections,
endless uploads. Each is a plain blocking socket; reads carry a timeout only as a safety net
(a hung test fails instead of hanging), never to wait for something to happen.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

HEAD = ("POST /v1/traces HTTP/1.1\r\nHost: receiver\r\nContent-Type: application/x-protobuf\r\n"
        "Content-Length: {length}\r\n{extra}\r\n")
#: The longest any read of these clients waits before the test fails.
SAFETY_S = 30.0


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host.strip("[]"), int(port)), timeout=SAFETY_S)
    return s


def slow_body(address: str, *, length: int = 1000, sent: bytes = b"x") -> socket.socket:
    """Headers of a ``length``-byte body, then ``sent`` of it, then nothing."""
    s = connect(address)
    s.sendall(HEAD.format(length=length, extra="").encode() + sent)
    return s


def slow_headers(address: str) -> socket.socket:
    """Half a header block, then nothing."""
    s = connect(address)
    s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: receiver\r\nContent-Ty")
    return s


def answer(s: socket.socket, limit: int = 1 << 16) -> bytes:
    """Everything the server writes until it closes the connection (or ``limit`` bytes)."""
    out = b""
    while len(out) < limit:
        try:
            data = s.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        out += data
    return out


def one_response(s: socket.socket) -> bytes:
    """One HTTP response (head and a Content-Length body), read as a client does: not until close."""
    out = b""
    while b"\r\n\r\n" not in out:
        data = s.recv(65536)
        if not data:
            return out
        out += data
    head, _, body = out.partition(b"\r\n\r\n")
    length = next((int(v) for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n")[1:])
                   if k.strip().lower() == b"content-length"), 0)
    while len(body) < length:
        data = s.recv(65536)
        if not data:
            break
        body += data
    return head + b"\r\n\r\n" + body


def status_of(response: bytes) -> int | None:
    """The status code of the first HTTP response in ``response`` (None: no response)."""
    line = response.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) > 1 and line[0].startswith(b"HTTP/1.") and line[1].isdigit() else None


@contextmanager
def sockets() -> Iterator[list[socket.socket]]:
    """A list for the test's sockets, all closed afterwards."""
    held: list[socket.socket] = []
    try:
        yield held
    finally:
        for s in held:
            s.close()
