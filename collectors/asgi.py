"""ASGI middleware: the server side of a request, joined to what the client saw.

    from collectors import Recorder
    from collectors.asgi import TracetoolMiddleware, request_handle

    rec = Recorder("server-trace").start()
    app.add_middleware(TracetoolMiddleware, recorder=rec)      # Starlette / FastAPI
    # or: app = TracetoolMiddleware(app, recorder=rec)          # any ASGI app

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        req = request_handle(request)             # the RequestHandle of this request
        with req.span("tokenize"):
            ...

Pure ASGI (no Starlette import), so it wraps whatever framework a user already
runs. Per HTTP request it:

* adopts the request id the client sent (``X-Request-ID``, else the trace-id of
  a W3C ``traceparent``) or makes one, and echoes it in ``X-Request-ID``;
* hands a :class:`~collectors.recorder.RequestHandle` to the app: in
  ``scope["state"]["tracetool_request"]`` (Starlette's ``request.state``) and as
  the current request of the task (``collectors.current_request()``, which
  also works in ``run_in_threadpool``). Model code on other threads (an engine
  worker) gets the handle passed explicitly and records on the same id;
* records a ``server.request`` span from the call (headers received) to the
  return of the ``send`` of the last body byte;
* closes the Recorder when the server shuts down (the ASGI lifespan's
  shutdown, after the app's own), so the trace ends ``"closed": true`` under
  uvicorn, which re-raises SIGTERM after its shutdown and so ends the process
  before a ``finally: rec.close()`` runs (``close_recorder=False`` to keep it);
* reports the server's own timing to the client, in milliseconds: a W3C
  ``Server-Timing`` header (``server;dur=…, queue;dur=…, tokenize;dur=…,
  prefill;dur=…, decode;dur=…, detokenize;dur=…``) on responses that are not
  Server-Sent Events, and for SSE streams the same numbers as a
  ``"server_timing": {"server": …, "queue": …}`` field of the last JSON data
  event before ``data: [DONE]`` (OpenAI-style clients ignore unknown fields).
  When that event went out in an earlier body message, a separate event with
  ``"choices": []`` carrying the field is sent just before ``[DONE]``.

The phase numbers are the request's summed server span durations
(``RequestHandle.durations_ns``); ``server`` is measured when the header (or
the final event) is built, so for a plain response it excludes sending the
body. Failures of the middleware's own logic are counted by the Recorder and
never reach the app; exceptions of the app pass through untouched.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from tracetool.recorder import Recorder, RequestHandle, now_ns
from tracetool.schema import PHASES
from tracetool.untrusted import clip

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Key of the handle in ``scope["state"]`` (``request.state.tracetool_request`` in Starlette).
STATE_KEY = "tracetool_request"
#: Name of the extra field in the final SSE data event.
SSE_FIELD = "server_timing"
#: Paths the middleware does not record by default.
SKIP_PATHS = ("/health", "/healthz", "/ready", "/metrics", "/ping", "/v1/models", "/models", "/favicon.ico")
#: Phases reported in ``Server-Timing``, in their serving order (tracetool.schema), after ``server``.
TIMING_PHASES = PHASES

_ID_RE = re.compile(r"^[A-Za-z0-9._:/+=@-]{1,128}$")
_TRACEPARENT_RE = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_DONE_RE = re.compile(rb"(^|\n)data: ?\[DONE\]")


def request_id_from_headers(headers: list[tuple[bytes, bytes]] | Any) -> str | None:
    """The request id a client sent: ``X-Request-ID`` if well-formed, else a ``traceparent`` trace-id."""
    rid = parent = None
    for k, v in headers or ():
        name = bytes(k).lower()
        if name == b"x-request-id" and rid is None:
            text = bytes(v).decode("latin-1").strip()
            if _ID_RE.match(text):
                rid = text
        elif name == b"traceparent" and parent is None:
            parent = bytes(v).decode("latin-1").strip().lower()
    if rid is not None:
        return rid
    if parent is not None:
        m = _TRACEPARENT_RE.match(parent)
        if m and m.group(1) != "ff" and m.group(2) != "0" * 32:
            return m.group(2)
    return None


def _last_json_event(text: bytes) -> tuple[int, int, dict[str, Any] | None]:
    """(start, end, parsed object) of the last ``data: {...}`` line in ``text``, if it is JSON."""
    j = text.rstrip().rfind(b"data:")
    if j < 0:
        return 0, 0, None
    end = text.find(b"\n", j)
    end = len(text) if end < 0 else end
    payload = text[j + 5:end].strip()
    if not payload.startswith(b"{"):
        return 0, 0, None
    try:
        event = json.loads(payload)
    except ValueError:
        return 0, 0, None
    return (j, end, event) if isinstance(event, dict) else (0, 0, None)


def request_handle(obj: Any) -> RequestHandle | None:
    """The handle the middleware made for a request: from a Starlette ``Request`` or an ASGI scope."""
    scope = getattr(obj, "scope", obj)
    try:
        state = scope.get("state")
        h = state.get(STATE_KEY) if state is not None else None
    except Exception:
        return None
    return h if isinstance(h, RequestHandle) else None


def timing_ms(handle: RequestHandle, server_ns: int) -> dict[str, float]:
    """``server`` and the recorded phases of a request, in milliseconds (3 decimals)."""
    out = {"server": round(server_ns / 1e6, 3)}
    d = handle.durations_ns
    for name in TIMING_PHASES:
        if name in d:
            out[name] = round(d[name] / 1e6, 3)
    return out


def server_timing_header(timing: dict[str, float]) -> str:
    """W3C Server-Timing value: ``server;dur=12.3, queue;dur=0.1, ...``."""
    return ", ".join(f"{k};dur={v:g}" for k, v in timing.items())


class TracetoolMiddleware:
    """Records ``server.request`` spans and reports ``Server-Timing``; see the module docstring.

    Args:
        app: the ASGI app to wrap.
        recorder: a started :class:`~collectors.recorder.Recorder`.
        close_recorder: close ``recorder`` when the server shuts down (ASGI lifespan), once the
            app has finished its own shutdown. uvicorn re-raises SIGTERM after its shutdown,
            which ends the process before a ``finally: rec.close()`` around ``uvicorn.run`` can
            run; the lifespan shutdown comes before that (after open requests have finished).
            False when the recorder outlives the server (``tracetool serve`` closes its own).
        server_timing: send the ``Server-Timing`` header / final SSE field.
        sse_field: name of the field in the final SSE event (None: no field).
        echo_request_id: set ``X-Request-ID`` on responses that do not carry one.
        skip_paths: paths passed through unrecorded (health checks, model lists, metrics:
            they are not inference requests and would only dilute the statistics).
    """

    def __init__(self, app: ASGIApp, recorder: Recorder, *, close_recorder: bool = True,
                 server_timing: bool = True, sse_field: str | None = SSE_FIELD, echo_request_id: bool = True,
                 skip_paths: Iterable[str] = SKIP_PATHS) -> None:
        self.app = app
        self.recorder = recorder
        self.close_recorder = close_recorder
        self.server_timing = server_timing
        self.sse_field = sse_field
        self.echo_request_id = echo_request_id
        self.skip_paths = frozenset(skip_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") == "lifespan" and self.close_recorder:
            await self.app(scope, receive, self._lifespan_send(send))
            return
        if scope.get("type") != "http" or scope.get("path") in self.skip_paths:
            await self.app(scope, receive, send)
            return
        t0 = now_ns()
        try:
            exchange = _Exchange(self, scope, t0)
        except Exception as e:  # our bug: never the app's problem
            self.recorder.error("asgi middleware", e)
            await self.app(scope, receive, send)
            return
        with exchange.handle:
            try:
                await self.app(scope, exchange.receive(receive), exchange.send(send))
            except BaseException as e:
                exchange.failed(e)
                raise
            finally:
                exchange.end()


    def _lifespan_send(self, send: Send) -> Send:
        """``send`` of the lifespan scope: the recorder is closed when the app reports its
        shutdown done (or failed), before the server hears of it and the process may end."""
        async def wrapped(msg: Message) -> None:
            if msg.get("type") in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                # on the event loop, on purpose: nothing is served any more, and a thread hop
                # would tie this pure-ASGI middleware to asyncio (trio servers run it too)
                self.recorder.guard(self.recorder.close, where="asgi middleware shutdown")
            await send(msg)
        return wrapped


class _Exchange:
    """The state of one request/response going through the middleware."""

    def __init__(self, mw: TracetoolMiddleware, scope: Scope, t0: int) -> None:
        self.mw = mw
        self.rec = mw.recorder
        self.t0 = t0
        rid = request_id_from_headers(scope.get("headers"))
        self.request_id = rid or os.urandom(16).hex()  # a random 128-bit id, as uuid4().hex, cheaper
        self.handle = self.rec.request(self.request_id)
        state = scope.get("state")
        if state is None:
            state = scope["state"] = {}
        state[STATE_KEY] = self.handle
        self.status: int | None = None
        self.sse = False
        self.done = False  # last body byte sent
        self.disconnected = False
        self.end_ns: int | None = None
        self.last_body: Any = None  # the last SSE body message before the one with [DONE]
        self.watch_sse = False

    # -- receive: notice a client that went away ---------------------------------------
    def receive(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            msg = await receive()
            if msg.get("type") == "http.disconnect" and not self.done:
                self.disconnected = True
            return msg
        return wrapped

    # -- send: headers, SSE field, the end of the response ------------------------------
    def send(self, send: Send) -> Send:
        async def wrapped(msg: Message) -> None:
            kind = msg.get("type")
            if kind == "http.response.start":
                msg = self.guard(self.on_start, msg)
            elif kind == "http.response.body":
                if self.watch_sse:  # per streamed event: one C-level search unless it is the end
                    body = msg.get("body") or b""
                    if b"[DONE]" in body:
                        msg = self.guard(self.on_sse_body, msg)
                    elif body:
                        self.last_body = body
                more = msg.get("more_body", False)
                await send(msg)
                if not more:
                    self.done = True
                    self.end_ns = now_ns()
                return
            await send(msg)
        return wrapped

    def guard(self, fn: Callable[[Message], Message], msg: Message) -> Message:
        try:
            return fn(msg)
        except Exception as e:
            self.rec.error("asgi middleware", e)
            return msg

    def on_start(self, msg: Message) -> Message:
        self.status = int(msg.get("status", 200))
        headers = list(msg.get("headers") or [])
        names = {bytes(k).lower() for k, _ in headers}
        for k, v in headers:
            if bytes(k).lower() == b"content-type" and bytes(v).lower().startswith(b"text/event-stream"):
                self.sse = True
        self.watch_sse = self.sse and self.mw.server_timing and bool(self.mw.sse_field)
        if self.mw.echo_request_id and b"x-request-id" not in names:
            headers.append((b"x-request-id", self.request_id.encode("latin-1")))
        if self.mw.server_timing and not self.sse and b"server-timing" not in names:
            value = server_timing_header(timing_ms(self.handle, now_ns() - self.t0))
            headers.append((b"server-timing", value.encode("latin-1")))
        out = dict(msg)
        out["headers"] = headers
        return out

    def on_sse_body(self, msg: Message) -> Message:
        body = bytes(msg.get("body") or b"")
        m = _DONE_RE.search(body)
        if m is None:  # "[DONE]" inside some text, not the terminating event
            self.last_body = body
            return msg
        self.watch_sse = False
        done_at = m.start() + len(m.group(1))
        head, tail = body[:done_at], body[done_at:]
        timing = timing_ms(self.handle, now_ns() - self.t0)
        field = self.mw.sse_field or SSE_FIELD
        # the event right before [DONE], if it is in this same message: add the field to it
        start, end, event = _last_json_event(head)
        if event is not None:
            event[field] = timing
            new = b"data: " + json.dumps(event, separators=(",", ":")).encode()
            return {**msg, "body": head[:start] + new + head[end:] + tail}
        # it went out earlier: send a separate event shaped like the stream's chunks
        _, _, last = _last_json_event(bytes(self.last_body or b""))
        extra = {k: last[k] for k in ("id", "object", "created", "model") if k in last} if last else {}
        new = b"data: " + json.dumps({**extra, "choices": [], field: timing}, separators=(",", ":")).encode()
        return {**msg, "body": head + new + b"\n\n" + tail}

    # -- the end -------------------------------------------------------------------------
    def failed(self, exc: BaseException) -> None:
        h = self.handle
        if h.status is None:
            h.status = "error"
            h.error = clip(f"{type(exc).__name__}: {exc}", 500)

    def end(self) -> None:
        try:
            end = self.end_ns if self.end_ns is not None else now_ns()
            self.rec.add_span("server.request", self.t0, end, request_id=self.request_id)
            h = self.handle
            if h.status is None or h.status == "ok":
                if self.status is not None and self.status >= 400:
                    h.status = "error"
                    h.error = h.error or f"HTTP {self.status}"
                elif not self.done:
                    h.status = "error"
                    h.error = h.error or ("client disconnected" if self.disconnected
                                          else "response not completed")
                else:
                    h.status = "ok"
        except Exception as e:
            self.rec.error("asgi middleware", e)
