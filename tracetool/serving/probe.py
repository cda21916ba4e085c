"""``tracetool probe``: a load client for any OpenAI-compatible server that records a trace.

It streams chat or completion requests (vLLM, SGLang, TGI, llama.cpp server,
``tracetool serve``) and writes what the client saw as a v1 trace:

* a ``client.request`` span per request (request sent, connection set-up
  included → last byte received), a ``client.queue`` span before it when the
  run has a schedule (``--rate``: intended send time → sent; time the request
  waited in the client for a concurrency slot or a late event loop, see
  :mod:`tracetool.serving.schedule`), and a ``client.connect`` span for each new
  TCP connection (the TCP handshake: one RTT sample per connection), both on
  the client clock;
* a ``tokens`` row per content chunk with ``client_recv_ns``;
* a ``requests`` row with sizes (the server's ``usage`` when it sends one) and
  the outcome (``ok``, or ``error`` with why: HTTP status, connection closed
  mid-stream, malformed SSE, timeout);
* when the server reports its own timing (a ``Server-Timing`` header, or the
  ``server_timing`` field of the last SSE event as tracetool's middleware
  sends), a ``server.request`` span and the phase spans (queue, tokenize,
  prefill, decode, detokenize) of the same request. Their **durations are the
  server's**; where they sit on the timeline is an estimate: the server clock
  of a probe trace is the client clock, and the server's part is centred in the
  client's request (symmetric delay, as NTP), prefill ending when the first
  token was sent. ``tokens.emit_ns`` is the receipt time minus that one-way
  estimate. ``tracetool merge`` replaces all of these with the server's own
  trace when there is one.

Network time per request is then ``client.request − server.request``: two
durations, no clock sync needed.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import replace
from typing import Any

from tracetool import units
from tracetool.errors import BadInput, UsageError
from tracetool.notices import say_once
from tracetool.serving import probe_events, server_timings
from tracetool.serving.probe_http import _error_message, _one_line, _read_capped, _rejected_field
from tracetool.serving.probe_trace import ProbeTraces, probe_meta
from tracetool.serving.probe_types import ProbeConfig, ProbeResult, RequestResult
from tracetool.serving.schedule import (
    CPU_BOUND,
    LAG_LIMIT_MS,
    LAG_WARN_SHARE,
    LoopMonitor,
    arrival_offsets,
    check_config,
    print_progress,
    progress_loop,
)
from tracetool.serving.sse import MalformedStream, SSEParser, parse_server_timing
from tracetool.serving.tokens import load_tokenizer
from tracetool.serving.workloads import Job, Turn, build_jobs, prompt_text
from tracetool.untrusted import clip

#: Most of an error body or model list read: enough for any message, bounded against endless bodies.
MAX_BODY_BYTES = 1 << 20

#: Client clock: epoch nanoseconds advanced by the monotonic clock (no jumps mid-run).
_EPOCH0 = time.time_ns() - time.perf_counter_ns()


def client_now() -> int:
    return time.perf_counter_ns() + _EPOCH0




def normalize_url(url: str, chat: bool | None) -> tuple[str, bool]:
    """(base URL ending in the API root, chat?) from what a user typed."""
    u = url.strip().rstrip("/")
    if "://" not in u:
        u = "http://" + u
    for suffix, is_chat in (("/chat/completions", True), ("/completions", False)):
        if u.endswith(suffix):
            u = u[: -len(suffix)]
            if chat is None:
                chat = is_chat
            break
    scheme, _, rest = u.partition("://")
    if scheme not in ("http", "https") or not rest:
        raise UsageError(f"not an http(s) URL: {url!r}")
    if "/" not in rest:
        u += "/v1"
    return u, True if chat is None else chat


class Prober:
    """Runs one probe: schedules requests, streams them, records them."""

    def __init__(self, cfg: ProbeConfig) -> None:
        self.cfg = cfg
        self.base, self.chat = normalize_url(cfg.url, cfg.chat)
        self.results: list[RequestResult] = []
        self.in_flight = 0
        self.finished = 0
        self.failed = 0
        self.recorder: Any = None
        self.scraper: Any = None  # collectors.prometheus.MetricsScraper with --metrics-url
        self.models_listed = False
        self.setup_connect: tuple[int, int] | None = None
        #: optional request fields, dropped (one notice each) when a server rejects them: usage in
        #: the stream, and vLLM's per-request metrics (ignored by servers that do not know it)
        self.optional: dict[str, Any] = (
            {"stream_options": {"include_usage": True}, "include_metrics": True} if cfg.include_usage else {})
        #: the client's settings, for a retry on a connection of its own
        self._client_args: dict[str, Any] = {}
        #: requests in flight, by index (what has arrived of them so far)
        self.live: dict[int, RequestResult] = {}
        self._t0 = time.monotonic()
        self.monitor = LoopMonitor(client_now, on_window=self._on_loop_window)
        self.tokenizer = load_tokenizer(cfg.tokenizer)
        #: every file is read and checked here, before anything is sent
        self.jobs = build_jobs(cfg, self.tokenizer)  # a ProbeConfig is its own WorkloadSpec
        self.total = sum(len(j.turns) for j in self.jobs)
        self.next_index = self.next_job = 0
        self.t0_ns = client_now()
        self.scheduled = False

    # -- the run ------------------------------------------------------------------------
    async def run(self) -> ProbeResult:
        import httpx

        cfg = self.cfg
        limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
        timeout = httpx.Timeout(cfg.timeout_s, connect=min(cfg.timeout_s, 10.0))
        headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
        self._client_args = {"timeout": timeout, "headers": headers, "trust_env": False}
        async with httpx.AsyncClient(limits=limits, **self._client_args) as client:
            model = cfg.model or await self._first_model(client)
            self._open_trace(model)
            self._start_scraper()
            self._t0 = time.monotonic()
            sem = asyncio.Semaphore(cfg.concurrency)
            progress = asyncio.ensure_future(self._progress()) if cfg.progress else None
            monitor = asyncio.ensure_future(self.monitor.run())
            tasks: list[asyncio.Future[Any]] = []
            try:
                await self._dispatch(client, sem, model, tasks)
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
                monitor.cancel()
                if progress is not None:
                    progress.cancel()
                    self._print_progress(final=True)
                self._close_trace()
        wall = time.monotonic() - self._t0
        self.results.sort(key=lambda r: r.index)
        return ProbeResult(cfg, self.base, model, self.chat, self.results, wall, cfg.out, self.setup_connect,
                           loop=self.monitor.stats, cpu_share=self.monitor.cpu_share(),
                           workload=probe_meta(self, model)["probe"]["workload"])

    async def _dispatch(self, client: Any, sem: asyncio.Semaphore, model: str,
                        tasks: list[asyncio.Future[Any]]) -> None:
        """Start every conversation when it is due: at its replay time, by the --rate schedule (within
        --duration, ramping over --ramp), or closed-loop (--concurrency workers, until the jobs or
        --duration run out). Requests due within --warmup are marked warm-up."""
        cfg = self.cfg
        self.t0_ns = t0 = client_now()
        if cfg.rate is None and cfg.replay is None:  # closed loop: no schedule, no client queue
            if cfg.duration_s is None:
                for job in self.jobs:
                    tasks.append(asyncio.ensure_future(
                        self._conversation(client, sem, self._take(job), job, model, None)))
                return
            tasks.extend(asyncio.ensure_future(self._worker(client, sem, model)) for _ in range(cfg.concurrency))
            return
        if cfg.replay is not None:
            offsets = [j.at or 0.0 for j in self.jobs]
            if cfg.duration_s is not None:
                offsets = [o for o in offsets if o < cfg.duration_s]
        else:
            assert cfg.rate is not None
            offsets = arrival_offsets(None if cfg.duration_s is not None else len(self.jobs), cfg.rate,
                                      seed=cfg.seed + 1, burstiness=cfg.burstiness, ramp_s=cfg.ramp_s,
                                      duration_s=cfg.duration_s)
        self.scheduled = True
        for i, at in enumerate(offsets):
            job = self._job(i)
            intended = t0 + int(at * 1e9)
            delay = (intended - client_now()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(self._conversation(client, sem, self._take(job), job, model, intended)))

    async def _worker(self, client: Any, sem: asyncio.Semaphore, model: str) -> None:
        """One closed-loop slot: the next conversation as soon as the last ended, until --duration."""
        end = self.t0_ns + int((self.cfg.duration_s or 0) * 1e9)
        while client_now() < end:
            job = self._job(self.next_job)
            await self._conversation(client, sem, self._take(job), job, model, None)

    def _job(self, i: int) -> Job:
        """Job ``i``, building more (seeded on) when a --duration run outlasts the ones built."""
        while i >= len(self.jobs):
            self.jobs.extend(build_jobs(replace(self.cfg, n=max(64, self.cfg.concurrency * 4),
                                                seed=self.cfg.seed + len(self.jobs)), self.tokenizer))
        return self.jobs[i]

    def _take(self, job: Job) -> int:
        """Request index of ``job``'s first turn (the turns after it take the next ones)."""
        first = self.next_index
        self.next_index += len(job.turns)
        self.next_job += 1
        self.total = max(self.total, self.next_index)
        return first

    def _on_loop_window(self, late_share: float, max_lag_ms: float) -> None:
        """Warn (once) when the probe's own event loop falls behind: near the limit its figures
        measure the client as much as the server."""
        if late_share >= LAG_WARN_SHARE:
            say_once("probe-loop-lag", f"the probe's event loop is lagging ({late_share * 100:.0f} % of wake-ups "
                     f"later than {LAG_LIMIT_MS:g} ms, worst {units.ms(max_lag_ms, 1)}): the probe is near what one "
                     "process can drive; its latencies include its own delay (use fewer requests/s per probe, "
                     "or several probes)")
        if self.monitor.cpu_share() >= CPU_BOUND:
            say_once("probe-cpu", "the probe process is using a whole CPU core: it is near what one process "
                     "can drive, and sends and reads late")

    async def _first_model(self, client: Any) -> str:
        import httpx

        url = f"{self.base}/models"

        marks: dict[str, int] = {}

        async def trace(name: str, info: dict[str, Any]) -> None:
            if name == "connection.connect_tcp.started":
                marks["start"] = client_now()
            elif name == "connection.connect_tcp.complete" and "start" in marks:
                self.setup_connect = (marks["start"], client_now())

        async def get() -> tuple[int, bytes]:
            async with client.stream("GET", url, extensions={"trace": trace}) as resp:
                return resp.status_code, await _read_capped(resp, MAX_BODY_BYTES)

        try:  # the whole exchange is bounded: a server dripping bytes never trips a read timeout
            status, raw = await asyncio.wait_for(get(), self.cfg.timeout_s)
        except asyncio.TimeoutError:
            raise BadInput(f"cannot reach {url}: timeout after {self.cfg.timeout_s:g} s") from None
        except httpx.HTTPError as e:
            raise BadInput(f"cannot reach {url}: {_one_line(e)}") from e
        if status >= 400:
            raise BadInput(f"{url} answered HTTP {status}; pass --model NAME")
        try:
            data = json.loads(raw)["data"]
            model = str(data[0]["id"])
            self.models_listed = True
            return model
        except (ValueError, KeyError, IndexError, TypeError, RecursionError) as e:
            raise BadInput(f"{url} did not list a model; pass --model NAME") from e

    async def _conversation(self, client: Any, sem: asyncio.Semaphore, first: int, job: Job, model: str,
                            intended_ns: int | None) -> None:
        """A job's turns one after another, each carrying the history (user turns and the answers
        received). A later turn is due when the answer before it ended; a failed turn ends it."""
        history: list[dict[str, Any]] = []
        for k, turn in enumerate(job.turns):
            if turn.messages is not None or not self.chat:
                ask = turn
            else:
                ask = Turn(messages=[*history, {"role": "user", "content": turn.text or ""}],
                           max_tokens=turn.max_tokens, source=turn.source)
            r = await self._guarded(client, sem, first + k, ask, model, intended_ns,
                                    keep_text=k < len(job.turns) - 1)
            if not r.ok:
                return
            history = [*(ask.messages or []), {"role": "assistant", "content": "".join(r.text)}]
            intended_ns = r.end_ns if self.scheduled else None

    async def _guarded(self, client: Any, sem: asyncio.Semaphore, i: int, prompt: Turn, model: str,
                       intended_ns: int | None = None, keep_text: bool = False) -> RequestResult:
        dispatched = client_now()
        async with sem:
            self.in_flight += 1
            text = prompt_text(prompt)
            r = RequestResult(i, uuid.uuid4().hex, len(text), intended_ns=intended_ns, dispatched_ns=dispatched,
                              keep_text=keep_text)
            # warm-up: due (or, closed loop, given its slot) within the first --warmup seconds
            r.warmup = ((intended_ns if intended_ns is not None else client_now()) - self.t0_ns
                        < self.cfg.warmup_s * 1e9)
            if self.tokenizer is not None:
                r.local_prompt_tokens = self.tokenizer.count(text)
            self.live[i] = r
            try:
                await self._request(client, r, prompt, model)
            finally:
                del self.live[i]
                self.in_flight -= 1
                self.finished += 1
                self.failed += 0 if r.ok else 1
                self.results.append(r)
                self._record(r)
        return r

    # -- one request ---------------------------------------------------------------------
    def _body(self, prompt: Turn, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "max_tokens": prompt.max_tokens or self.cfg.max_tokens,
                                "stream": True}
        if self.chat:
            body["messages"] = (prompt.messages if prompt.messages is not None
                                else [{"role": "user", "content": prompt.text or ""}])
        else:
            body["prompt"] = prompt_text(prompt)
        body.update(self.optional)
        if self.cfg.ignore_eos:
            body["ignore_eos"] = True
        return body

    async def _request(self, client: Any, r: RequestResult, prompt: Turn, model: str) -> None:
        import httpx

        url = f"{self.base}/chat/completions" if self.chat else f"{self.base}/completions"
        headers = {"X-Request-ID": r.request_id, "traceparent": f"00-{r.request_id}-{uuid.uuid4().hex[:16]}-01",
                   "Accept": "text/event-stream"}
        marks: dict[str, int] = {}

        async def trace(name: str, info: dict[str, Any]) -> None:
            t = client_now()
            if name in ("connection.connect_tcp.started", "connection.start_tls.started"):
                marks[name] = t
            elif name == "connection.connect_tcp.complete" and "connection.connect_tcp.started" in marks:
                r.connect = (marks["connection.connect_tcp.started"], t)
            elif name == "connection.start_tls.complete" and "connection.start_tls.started" in marks:
                r.tls = (marks["connection.start_tls.started"], t)

        r.start_ns = client_now()
        pooled_close = False
        try:
            await asyncio.wait_for(self._stream(client, url, r, self._body(prompt, model), headers, trace),
                                   self.cfg.timeout_s)
        except asyncio.TimeoutError:
            r.fail(f"timeout after {self.cfg.timeout_s:g} s")
        except MalformedStream as e:
            r.fail(f"malformed SSE: {e}")
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            r.fail(f"connect failed: {_one_line(e)}")
            r.unreachable = True
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
            where = "mid-stream" if r.http_status is not None else "before the response"
            r.fail(f"connection closed {where}: {_one_line(e)}")
            # no TCP handshake in this attempt: the request went out on a pooled connection
            pooled_close = r.http_status is None and r.connect is None
        except httpx.TimeoutException as e:
            r.fail(f"timeout: {type(e).__name__}")
        except httpx.HTTPError as e:
            r.fail(f"{type(e).__name__}: {_one_line(e)}")
        except Exception as e:  # whatever a server sends fails this request only, never the run
            r.fail(f"probe error: {type(e).__name__}: {_one_line(e)}")
        if not r.end_ns:
            r.end_ns = client_now()
        if pooled_close and r.retry is None:
            await self._retry_fresh(r, prompt, model)
            return
        rejected = _rejected_field(r, self.optional)
        if rejected is not None:
            # a server that rejects an optional field: say so once, stop sending it, send this one again
            del self.optional[rejected]
            say_once(f"probe-no-{rejected}", f"{self.base} rejects {rejected}; probing without it"
                     + (" (token counts are content chunks)" if rejected == "stream_options" else ""))
            await self._again(client, r, prompt, model)

    async def _retry_fresh(self, r: RequestResult, prompt: Turn, model: str) -> None:
        """Send ``r`` again, once, on a connection of its own, after a pooled connection was closed
        before any response byte: the server never saw the request (llama.cpp's llama-server closes
        a connection after each stream, and the pool may hand out that connection before it notices).
        The first attempt is kept in ``retry``; whatever the second attempt gets is the outcome."""
        import httpx

        fresh = r.new_attempt()
        fresh.retry = (r.start_ns, r.end_ns, r.error or "connection closed before the response")
        one = httpx.Limits(max_connections=1, max_keepalive_connections=0)
        async with httpx.AsyncClient(limits=one, **self._client_args) as client:
            await self._request(client, fresh, prompt, model)
        if fresh.error is not None:
            fresh.error = clip(fresh.error + " (sent again on a new connection)", 500)
        r.become(fresh)

    async def _again(self, client: Any, r: RequestResult, prompt: Turn, model: str) -> None:
        """Send request ``r`` once more as a fresh result, keeping its id and index."""
        fresh = r.new_attempt()
        await self._request(client, fresh, prompt, model)
        fresh.retry = fresh.retry or r.retry
        r.become(fresh)

    async def _stream(self, client: Any, url: str, r: RequestResult, body: dict[str, Any],
                      headers: dict[str, str], trace: Any) -> None:
        async with client.stream("POST", url, json=body, headers=headers, extensions={"trace": trace}) as resp:
            r.http_status = resp.status_code
            r.reached = True
            st = resp.headers.get("server-timing")
            if st:
                r.server_timing = parse_server_timing(st) or None
                if r.server_timing:
                    r.timing_sources.append(server_timings.SOURCE_HEADER)
            if resp.status_code >= 400:
                raw = await _read_capped(resp, MAX_BODY_BYTES)
                r.end_ns = client_now()
                r.fail(f"HTTP {resp.status_code}: {_error_message(raw)}")
                return
            ctype = resp.headers.get("content-type", "")
            if "text/event-stream" not in ctype:
                await _read_capped(resp, MAX_BODY_BYTES)
                r.end_ns = client_now()
                r.fail(f"server did not stream (content-type {ctype or 'missing'!r})")
                return
            parser = SSEParser()
            async for chunk in resp.aiter_bytes():
                t = client_now()
                for data in parser.feed(chunk):
                    self._on_event(r, data, t)
            for data in parser.close():
                self._on_event(r, data, client_now())
            r.end_ns = client_now()
        probe_events.end_of_stream(r, parser.junk)

    def _on_event(self, r: RequestResult, data: str, t: int) -> None:
        probe_events.on_event(r, data, t)

    # -- progress on stderr (tracetool.serving.schedule) -------------------------------------------
    async def _progress(self) -> None:
        await progress_loop(self._print_progress)

    def _print_progress(self, final: bool = False) -> None:
        print_progress(f"probe: {self.finished}/{self.total} done, {self.failed} failed, "
                       f"{self.in_flight} in flight, {time.monotonic() - self._t0:.1f} s", final)

    # -- the trace (tracetool.serving.probe_trace) ------------------------------------------------
    def _open_trace(self, model: str) -> None:
        if self.cfg.out is not None:
            self.recorder = ProbeTraces(self.cfg.out, probe_meta(self, model), self.setup_connect)

    def _start_scraper(self) -> None:
        """With --metrics-url: scrape the engine's metrics into the trace until it closes; the first
        scrape is waited for (a bounded time) so the window's counters have a baseline."""
        if self.cfg.metrics_url is None or self.recorder is None:
            return
        from collectors.prometheus import attach_scraper, metrics_url

        self.scraper = attach_scraper(self.recorder.main, metrics_url(self.cfg.metrics_url, self.base), clock="client",
                                      interval_s=self.cfg.metrics_interval_s, now=client_now)

    def _record(self, r: RequestResult) -> None:
        if self.recorder is not None:
            self.recorder.record(r)

    def _close_trace(self) -> None:
        if self.recorder is not None:
            # the probe's own stalls, evidence for client-bound where a schedule could fall behind
            self.recorder.close(self.monitor.stats.stalls if self.scheduled else [])


def run_probe(cfg: ProbeConfig) -> ProbeResult:
    """Run a probe to completion (blocking). Raises BadInput when the server cannot be reached."""
    check_config(cfg)  # a usage error before anything is sent
    if cfg.metrics_url is not None:
        from collectors.prometheus import metrics_url

        if cfg.out is None:
            raise UsageError("--metrics-url needs -o: the samples go into the trace's server_metrics table")
        metrics_url(cfg.metrics_url, cfg.url)  # a bad URL is a usage error before anything is sent
    prober = Prober(cfg)
    result = asyncio.run(prober.run())
    if not prober.models_listed and all(r.unreachable for r in result.results):
        first = next((r.error for r in result.results if r.error), "no response")
        raise BadInput(f"nothing could be reached at {result.base_url}: {first}")
    return result
