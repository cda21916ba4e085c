"""The Recorder: the trace core's write API, which every collector is built on.

    rec = Recorder("trace_dir").start()
    with rec.request("req-1", prompt_tokens=12) as req:
        with req.span("tokenize"):
            ids = tokenizer.encode(text)
        for i, tok in enumerate(my_loop(ids)):
            req.token(i, kv_len=len(ids) + i)
    rec.close()

Timestamps are server-clock nanoseconds (``time.time_ns()``); every call also
takes explicit timestamps, so timings replayed from logs land in the same
tables. Nothing here raises into the caller once the Recorder has started:
a bad value is counted in :attr:`Recorder.errors` (the first one is said on
stderr) and the row is skipped.
"""

from __future__ import annotations

import contextvars
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from tracetool.notices import say_once
from tracetool.schema import INT_NULL
from tracetool.untrusted import clip
from tracetool.writer import PackedSink, TraceWriter

NULL = INT_NULL
now_ns: Callable[[], int] = time.time_ns

_current: contextvars.ContextVar[RequestHandle | None] = contextvars.ContextVar(
    "tracetool_request", default=None)


class LiveStream(Protocol):
    """A running live endpoint, as the Recorder drives it (:class:`tracetool.live.sidecar.LiveSidecar`)."""

    def finish(self, writer: TraceWriter) -> None:
        """Before the trace closes: say in ``meta.json`` what the endpoint served."""

    def close(self) -> object:
        """After the trace closed (its last batches sent): stop the endpoint."""


class LiveSpec(Protocol):
    """What ``Recorder(live=...)`` takes: a live endpoint's options that can start one on a writer
    (:class:`tracetool.live.sidecar.SidecarSpec`). The core only drives it; the endpoint itself
    lives in :mod:`tracetool.live`, a layer above the core."""

    def start_live(self, writer: TraceWriter) -> LiveStream:
        """Start streaming ``writer``'s trace; raise :class:`~tracetool.errors.UsageError` when
        the address cannot be bound."""
        ...


def current_request() -> RequestHandle | None:
    """The request open in this thread or task, if any."""
    return _current.get()


def new_request_id() -> str:
    return uuid.uuid4().hex


class Recorder:
    """Records spans, tokens, steps and request facts into a v1 trace.

    Args:
        out: trace directory to write (ignored when ``writer`` is given).
        writer: an existing :class:`TraceWriter` to share.
        meta: extra ``meta.json`` fields (``model``, ``hardware``).
        enabled: start recording at once; flip :attr:`enabled` at run time.
        live: stream the trace to viewers while it is written (``tracetool attach``): a
            :class:`~tracetool.live.sidecar.SidecarSpec` (``live_spec(LiveConfig(...))``: address,
            token, TLS, limits; the ``collectors.Recorder`` spelling also takes a
            :class:`~tracetool.live.config.LiveConfig`, or an address ``"127.0.0.1:PORT"``). Off by
            default. :meth:`start` starts the endpoint (a small process of its own) and raises
            :class:`~tracetool.errors.UsageError` when the address cannot be bound (docs/live.md).
        writer_options: passed to :class:`TraceWriter` (``flush_rows``, ``max_pending_rows``...).
    """

    def __init__(self, out: str | Path | None = None, *, writer: TraceWriter | None = None,
                 meta: Mapping[str, Any] | None = None, enabled: bool = True,
                 live: LiveSpec | None = None,
                 **writer_options: Any) -> None:
        if writer is None:
            if out is None:
                raise ValueError("Recorder needs an output directory or a writer")
            writer = TraceWriter(out, meta=meta, declare=("spans", "tokens"), **writer_options)
        elif meta:
            writer.update_meta(**dict(meta))
        self.writer = writer
        self._enabled = bool(enabled)
        #: collectors that keep their own copy of the flag (the C step slot): told on every change
        self._switches: list[Callable[[bool], None]] = []
        self.errors = 0
        self._spans = _packed(writer, "spans")
        self._tokens = _packed(writer, "tokens")
        #: pinned interner codes of the span names seen so far, and of the server clock: the
        #: per-token span path packs a row with a dict lookup instead of three interner calls
        self._span_codes: dict[str, int] = {}
        self._server_code = writer.interner.pin("server")
        self._lock = threading.Lock()
        self._closers: list[Callable[[], None]] = []
        self._live_spec = live
        #: The live endpoint once started (``live=``), else None.
        self.live: LiveStream | None = None

    @property
    def enabled(self) -> bool:
        """Whether rows are recorded; set it at run time to switch recording off and on."""
        return self._enabled

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self._enabled = bool(on)
        for fn in list(self._switches):
            fn(self._enabled)

    def on_switch(self, fn: Callable[[bool], None]) -> Callable[[], None]:
        """Call ``fn(enabled)`` whenever :attr:`enabled` is set (a collector that keeps its own
        copy of the flag, where reading the recorder's would cost a step); returns the undo."""
        self._switches.append(fn)

        def forget() -> None:
            if fn in self._switches:
                self._switches.remove(fn)

        return forget

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> Recorder:
        if self._live_spec is not None and self.live is None:
            self.live = self._live_spec.start_live(self.writer)  # before the writer: set-up errors first
        try:
            self.writer.start()
        except BaseException:
            if self.live is not None:
                self.live.close()
                self.live = None
            raise
        return self

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def on_close(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Run ``fn`` before the trace is closed (collectors flush their own state).

        Returns a function that takes ``fn`` back (a collector removed before the recorder
        closes: the recorder then no longer holds it, nor what it holds)."""
        self._closers.append(fn)

        def forget() -> None:
            if fn in self._closers:
                self._closers.remove(fn)

        return forget

    def close(self) -> None:
        """Stop collectors registered with :meth:`on_close`, then finish the trace."""
        closers, self._closers = self._closers, []
        for fn in reversed(closers):
            self.guard(fn)
        if self.errors:
            self.writer.note(f"collector errors: {self.errors} (rows skipped; see stderr for the first)")
        live, self.live = self.live, None
        if live is not None:
            self.guard(live.finish, self.writer, where="live endpoint")
        self.writer.close()  # the last batches still reach the viewers
        if live is not None:
            self.guard(live.close, where="live endpoint")

    @property
    def path(self) -> Path:
        return self.writer.directory

    def note(self, text: str) -> None:
        self.writer.note(text)

    def sink(self, table: str) -> Any:
        """The writer's sink for any v1 table (gpu, stacks, steps, ...)."""
        return self.writer.sink(table)

    # -- errors ----------------------------------------------------------------------
    def error(self, where: str, exc: BaseException) -> None:
        """Count a collector failure; say the first one on stderr. Never raises."""
        self.errors += 1
        say_once(f"collector-error-{id(self)}",
                 f"collector error in {where}: {type(exc).__name__}: {exc} "
                 "(counted; the host keeps running; later errors are only counted)")

    def guard(self, fn: Callable[..., Any], *args: Any, where: str | None = None, **kwargs: Any) -> Any:
        """Call ``fn``; on an exception count it and return None."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            self.error(where or str(getattr(fn, "__qualname__", "collector")), e)
            return None

    # -- requests --------------------------------------------------------------------
    def request(self, request_id: str | None = None, *, prompt_tokens: int | None = None,
                prompt_chars: int | None = None) -> RequestHandle:
        """A context for one request: spans and tokens inside it carry its id."""
        return RequestHandle(self, request_id or new_request_id(), prompt_tokens, prompt_chars)

    def _handle(self, request_id: str | None) -> RequestHandle | None:
        if request_id is None:
            return _current.get()
        return None

    # -- spans -----------------------------------------------------------------------
    def add_span(self, name: str, start_ns: int, end_ns: int, *, request_id: str | None = None,
                 clock: str = "server") -> None:
        """Record a span with explicit timestamps."""
        if not self._enabled:
            return
        if request_id is None:
            cur = _current.get()
            request_id = cur.request_id if cur is not None else ""
            if cur is not None and clock == "server":
                cur._add_duration(name, start_ns, end_ns)
        try:
            s = self._spans
            code = s.interner.code
            if s.full():
                s.dropped += 1
                return
            s.buf.frombytes(s.pack(code(request_id), code(name), int(start_ns), int(end_ns), code(clock)))
        except Exception as e:
            self.error("span", e)

    def _span_code(self, name: str) -> int:
        c = self._span_codes[name] = self.writer.interner.pin(name)
        return c

    @contextmanager
    def span(self, name: str, *, request_id: str | None = None, clock: str = "server") -> Iterator[None]:
        """Time the body as a span of the current (or given) request."""
        start = now_ns()
        try:
            yield
        finally:
            self.add_span(name, start, now_ns(), request_id=request_id, clock=clock)

    # -- tokens ----------------------------------------------------------------------
    def token(self, index: int, kv_len: int = NULL, emit_ns: int = 0, step_start_ns: int = NULL,
              step_end_ns: int = NULL, batch_size: int = NULL, step_id: int = NULL,
              client_recv_ns: int = NULL, *, request_id: str | None = None) -> None:
        """Record a generated token of the current (or given) request.

        ``emit_ns`` defaults to now; other columns default to null (None works too).
        """
        if not self._enabled:
            return
        try:
            if request_id is None:
                cur = _current.get()
                if cur is not None:
                    cur.token(index, kv_len, emit_ns, step_start_ns, step_end_ns, batch_size, step_id,
                              client_recv_ns)
                    return
                request_id = ""
            s = self._tokens
            if s.full():
                s.dropped += 1
                return
            s.append((request_id, index, emit_ns or now_ns(), kv_len, step_start_ns, step_end_ns, batch_size,
                      client_recv_ns, step_id))
        except Exception as e:
            self.error("token", e)

    def tokens(self, columns: Mapping[str, Any]) -> None:
        """Record many tokens at once, column-wise (``request_id``, ``index``, ``emit_ns``, ...).

        The cheap path for batched engines: one call per engine step.
        """
        if not self._enabled:
            return
        try:
            self._tokens.append_batch(columns)
        except Exception as e:
            self.error("tokens", e)

    # -- steps and request facts -----------------------------------------------------
    def step(self, step_id: int, start_ns: int, end_ns: int, *, batch_size: int, prefill_tokens: int = 0,
             decode_tokens: int = 0, kv_tokens: int = 0) -> None:
        """Record one engine iteration (a forward pass over the batch)."""
        if not self._enabled:
            return
        try:
            self.writer.sink("steps").append((step_id, start_ns, end_ns, batch_size, prefill_tokens,
                                              decode_tokens, kv_tokens))
        except Exception as e:
            self.error("step", e)

    def request_info(self, request_id: str, *, prompt_tokens: int | None = None,
                     output_tokens: int | None = None, status: str | None = None,
                     error: str | None = None, prompt_chars: int | None = None,
                     cached_prompt_tokens: int | None = None, reasoning_tokens: int | None = None) -> None:
        """Record a ``requests`` row: sizes and outcome of one request."""
        if not self._enabled:
            return
        try:
            self.writer.sink("requests").append((request_id, prompt_tokens, output_tokens, status,
                                                 error, prompt_chars, cached_prompt_tokens, reasoning_tokens))
        except Exception as e:
            self.error("request_info", e)


def _packed(writer: TraceWriter, table: str) -> PackedSink:
    sink = writer.sink(table)
    if not isinstance(sink, PackedSink):
        raise TypeError(f"{table} sink is not packed")
    return sink


class RequestHandle:
    """One request being recorded; use as a context manager (sets the current request)."""

    __slots__ = ("_buf", "_frombytes", "_max_items", "_pack", "_spans", "_tok", "_token_ctx", "code",
                 "durations_ns", "error", "output_tokens", "prompt_chars", "prompt_tokens", "recorder",
                 "request_id", "status")

    def __init__(self, rec: Recorder, request_id: str, prompt_tokens: int | None,
                 prompt_chars: int | None) -> None:
        #: the recorder this request writes to
        self.recorder = rec
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.prompt_chars = prompt_chars
        self.output_tokens: int | None = None
        self.status: str | None = None
        self.error: str | None = None
        self._tok: PackedSink = rec._tokens
        #: ``request_id``'s code in the recorder's interner: what the rows carry instead of the string
        #: (a collector's own feed of token rows may carry it too)
        self.code = self._tok.interner.code(request_id)
        # bound once: the token hot path is a handful of local loads and one C append
        self._buf = self._tok.buf
        self._frombytes = self._buf.frombytes
        self._pack = self._tok.pack
        self._max_items = self._tok.max_items
        self._spans: PackedSink = rec._spans  # the same interner: self.code is the request's code there too
        self._token_ctx: contextvars.Token[RequestHandle | None] | None = None
        #: Summed server-clock span durations of this request by name, in ns (spans recorded
        #: through this handle, even while recording is disabled, or as the current request):
        #: what the ASGI middleware reports back to the client as ``Server-Timing``.
        self.durations_ns: dict[str, int] = {}

    def __enter__(self) -> RequestHandle:
        self._token_ctx = _current.set(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self._token_ctx is not None:
            try:
                _current.reset(self._token_ctx)
            except ValueError:  # exited in another context (generator finalised elsewhere)
                _current.set(None)
            self._token_ctx = None
        if exc is not None and self.status is None:
            self.status = "error"
            self.error = clip(f"{type(exc).__name__}: {exc}", 500)
        self.finish()

    def finish(self) -> None:
        """Write the request's facts (called by ``__exit__``; call it yourself without ``with``)."""
        rec = self.recorder
        if any(v is not None for v in (self.prompt_tokens, self.output_tokens, self.status,
                                       self.prompt_chars)):
            rec.request_info(self.request_id, prompt_tokens=self.prompt_tokens,
                             output_tokens=self.output_tokens, status=self.status or "ok",
                             error=self.error, prompt_chars=self.prompt_chars)
        self._tok.interner.retire(self.code)

    def token(self, index: int, kv_len: int = NULL, emit_ns: int = 0, step_start_ns: int = NULL,
              step_end_ns: int = NULL, batch_size: int = NULL, step_id: int = NULL,
              client_recv_ns: int = NULL) -> None:
        """Record token ``index`` of this request: the per-token hot path (one C call to append)."""
        if not self.recorder._enabled:
            return
        if len(self._buf) >= self._max_items:
            self._tok.dropped += 1
            return
        try:
            self._frombytes(self._pack(self.code, index, emit_ns or now_ns(), kv_len, step_start_ns,
                                       step_end_ns, batch_size, client_recv_ns, step_id))
        except (struct.error, TypeError):
            self._slow_token(index, kv_len, emit_ns, step_start_ns, step_end_ns, batch_size, step_id,
                             client_recv_ns)

    def _slow_token(self, *values: Any) -> None:
        # None (or a numpy/torch integer) given explicitly: normalise, else count the error.
        try:
            index, kv_len, emit_ns, ss, se, bs, sid, cr = (
                NULL if v is None else int(v) for v in values)
            s = self._tok
            s.buf.frombytes(s.pack(self.code, index, emit_ns or now_ns(), kv_len, ss, se, bs, cr, sid))
        except Exception as e:
            self.recorder.error("token", e)

    def add_span(self, name: str, start_ns: int, end_ns: int, clock: str = "server") -> None:
        """Record a span of this request: a per-token hot path in servers (``decode`` and
        ``detokenize`` per token), so a server-clock span with int times is one dict lookup
        for the name's code and one C append; anything else takes :meth:`Recorder.add_span`."""
        rec = self.recorder
        if clock != "server":
            rec.add_span(name, start_ns, end_ns, request_id=self.request_id, clock=clock)
            return
        self._add_duration(name, start_ns, end_ns)
        if not rec._enabled:
            return
        spans = self._spans
        if len(spans.buf) >= spans.max_items:
            spans.dropped += 1
            return
        code = rec._span_codes.get(name)
        try:
            if code is None:
                code = rec._span_code(name)
            spans.buf.frombytes(spans.pack(self.code, code, start_ns, end_ns, rec._server_code))
        except (struct.error, TypeError):  # None or a numpy integer as a time: normalised there
            rec.add_span(name, start_ns, end_ns, request_id=self.request_id, clock=clock)

    @contextmanager
    def span(self, name: str, clock: str = "server") -> Iterator[None]:
        start = now_ns()
        try:
            yield
        finally:
            self.add_span(name, start, now_ns(), clock=clock)

    def _add_duration(self, name: str, start_ns: int, end_ns: int) -> None:
        try:
            d = self.durations_ns
            d[name] = d.get(name, 0) + max(0, int(end_ns) - int(start_ns))
        except Exception as e:
            self.recorder.error("span duration", e)
