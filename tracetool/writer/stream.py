"""One Arrow IPC stream file being appended to, one complete message per ``write``.

The schema message is written when the file is created, so even a killed
process leaves a readable (empty) table; each record batch is then one
``os.write``, so a killed process leaves a readable prefix, and a write that
fails half-way (disk full, file-size limit) is cut back to the last whole
message.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa

#: Batches with fewer rows are written uncompressed: LZ4 frames have a fixed cost per buffer
#: whatever its size, which is most of a small flush's cost (a live recording flushes several
#: times a second) and saves a few KB. Larger batches compress (smaller and faster to write).
#: Compression is per batch in the IPC format, so a stream may mix both.
COMPRESS_MIN_ROWS = 1024
#: The IPC end-of-stream marker.
EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


class _Parts:
    """A write-only file object that keeps what Arrow writes, so each IPC message
    can go to disk in one ``os.write``."""

    closed = False

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: Any) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


class _BatchEncoder:
    """Encodes record batches as IPC messages (no schema message) with one compression setting."""

    def __init__(self, schema: pa.Schema, head: bytes, compression: str) -> None:
        self._parts = _Parts()
        self._head = head
        self._first = True
        # Arrow compresses a batch's buffers on its own thread pool by default: for the few
        # hundred KB of a flush that costs more CPU than compressing them here (handing the
        # buffers over and back, waking pool threads that compete with the host's for a core),
        # and hides it from the writer thread's CPU clock, which is how the overhead is measured.
        options = pa.ipc.IpcWriteOptions(compression=compression, use_threads=False)
        self._writer = pa.ipc.new_stream(pa.PythonFile(self._parts, mode="w"), schema, options=options)

    def encode(self, batch: pa.RecordBatch) -> bytes:
        self._writer.write_batch(batch)
        data = self._parts.take()
        if self._first:  # the schema message is written once, by the file
            self._first = False
            if not data.startswith(self._head):
                raise ValueError("unexpected IPC schema message")
            data = data[len(self._head):]
        return data


class StreamFile:
    """An Arrow IPC stream file at ``path``, created (truncated) with its schema message.

    Args:
        path: the file.
        schema: the table's Arrow schema.
        compression: IPC buffer compression of batches of ``COMPRESS_MIN_ROWS`` rows or more
            (``"lz4"``, ``"zstd"`` or None).
    """

    def __init__(self, path: Path, schema: pa.Schema, compression: str | None) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        #: bytes written so far (the writer starts a new segment past a size)
        self.bytes = 0
        self.schema = schema
        self.compression = compression
        self._head = schema.serialize().to_pybytes()
        self._encoders: dict[str, _BatchEncoder] = {}
        try:
            self._write(self._head)
        except OSError:
            os.close(self.fd)
            raise

    def _write(self, data: bytes | pa.Buffer) -> None:
        start = self.bytes
        view = memoryview(data)
        try:
            while view:
                n = os.write(self.fd, view)
                view = view[n:]
                self.bytes += n
        except OSError:
            # A full disk or a file-size limit can cut a message in the middle: cut the file
            # back to the last whole message, so what was written stays a valid stream.
            try:
                os.ftruncate(self.fd, start)
                self.bytes = start
            except OSError:
                pass
            raise

    def write_batch(self, batch: pa.RecordBatch) -> None:
        """Append ``batch`` as one IPC message in one write."""
        comp = self.compression if batch.num_rows >= COMPRESS_MIN_ROWS else None
        if comp is None:
            # an uncompressed batch's stream message is exactly what serialize() gives (one
            # call instead of a stream writer and a Python file; tests/unit/test_writer.py
            # checks the bytes are the same)
            self._write(batch.serialize())
            return
        enc = self._encoders.get(comp)
        if enc is None:
            enc = self._encoders[comp] = _BatchEncoder(self.schema, self._head, comp)
        self._write(enc.encode(batch))

    def abandon(self) -> None:
        """Close without writing more (the writer stopped): the file ends at its last whole message."""
        os.close(self.fd)

    def close(self, fsync: bool = True) -> None:
        """Write the end-of-stream marker, optionally fsync, and close."""
        try:
            self._write(EOS)
            if fsync:
                os.fsync(self.fd)
        finally:
            os.close(self.fd)
