"""Scrape a server's Prometheus ``/metrics`` while a run goes on: the engine's state over time.

vLLM, SGLang, TGI, llama.cpp's server and TensorRT-LLM / Dynamo export requests
running and waiting, KV-cache usage, preemptions, prefix-cache hits and queue,
prefill and decode time histograms. :class:`MetricsScraper` reads them every
``interval_s`` on a thread of its own and writes every sample as a
``server_metrics`` row (docs/trace-format.md): ``ts_ns`` on the scraping
host's clock (``clock`` says which), the sample's name, its labels as JSON,
its value. Counters stay raw running totals; the analyzers take deltas over
the measured window (analyzers/engine.sql).

Parsing is prometheus_client's (its text-format parser, or its OpenMetrics
parser when the server answers ``application/openmetrics-text``). What a bad
endpoint does never reaches the run being measured:

* unreachable, a timeout, a hang, HTTP 5xx: one warning, scraping goes on
  (the server may be restarting);
* HTTP 4xx, an HTML page, a body that is not the exposition format, or one
  over :data:`MAX_METRICS_BYTES`: one warning, scraping stops;
* malformed lines among good ones: the good ones are kept, one warning.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tracetool.errors import one_line
from tracetool.untrusted import echo

#: Largest /metrics body read (vLLM's is ~100 kB; a bigger one is not an engine's metrics page).
MAX_METRICS_BYTES = 16 << 20
#: The scrape interval when none is given, seconds.
DEFAULT_INTERVAL_S = 1.0
#: Samples left out: ``_created`` series are the time a counter was created, not engine state.
SKIPPED_SUFFIXES = ("_created",)

Row = tuple[int, str, str, float, str]


def metrics_url(url: str, endpoint: str | None = None) -> str:
    """The URL to scrape: ``url`` as given, or for ``auto`` the endpoint's origin + ``/metrics``."""
    from tracetool.errors import UsageError

    u = url.strip()
    if u == "auto":
        if not endpoint:
            raise UsageError("--metrics-url auto needs the server's URL; give the metrics URL itself")
        e = endpoint.strip()
        if "://" not in e:
            e = "http://" + e
        scheme, _, rest = e.partition("://")
        host = rest.split("/", 1)[0]
        if not host:
            raise UsageError(f"not an http(s) URL: {endpoint!r}")
        return f"{scheme}://{host}/metrics"
    if "://" not in u:
        u = "http://" + u
    if u.partition("://")[0] not in ("http", "https") or not u.partition("://")[2]:
        raise UsageError(f"--metrics-url: not an http(s) URL: {url!r}")
    return u


class NotMetrics(Exception):
    """The endpoint answered something that is not Prometheus metrics: scraping stops."""


Sample = tuple[str, str, float]

#: Where one metric family's text begins in the text format (each family opens with its HELP line).
_FAMILY_RE = re.compile(r"\n(?=# HELP )")


class Exposition:
    """Parses successive scrapes of one endpoint with prometheus_client's parsers, re-using the
    result for every family whose text did not change since the previous scrape.

    The text format is cut where each family's ``# HELP`` line begins and each family is handed
    to the parser alone: between two scrapes a second apart most families (the histograms of
    phases no request finished in, the info gauges) are the same bytes, and parsing them again
    was most of a scrape's CPU. OpenMetrics text is parsed whole (its ``# EOF`` ends the text).
    """

    def __init__(self) -> None:
        self._cache: dict[str, tuple[list[Sample], int]] = {}

    def parse(self, text: str, content_type: str = "") -> tuple[list[Sample], int]:
        """``(samples, malformed_lines)``: (name, labels JSON, value) per sample.

        A family the parser refuses (one bad line fails its whole text there) is parsed line by
        line and its malformed lines counted. Raises :class:`NotMetrics` when nothing parses.
        """
        if "openmetrics" in content_type.lower():
            try:
                from prometheus_client.openmetrics.parser import (
                    text_string_to_metric_families as om_families,
                )

                return _samples(om_families(text)), 0
            except Exception:  # not valid OpenMetrics after all: try the text format
                pass
        cache: dict[str, tuple[list[Sample], int]] = {}
        out: list[Sample] = []
        bad = 0
        for block in _FAMILY_RE.split(text):
            got = self._cache.get(block) or cache.get(block)
            if got is None:
                got = _parse_block(block)
            cache[block] = got
            out += got[0]
            bad += got[1]
        self._cache = cache  # only the current scrape's families are kept
        if not out and bad:
            raise NotMetrics("not the Prometheus exposition format")
        return out, bad


def parse_metrics(text: str, content_type: str = "") -> tuple[list[Sample], int]:
    """One exposition parsed on its own (see :meth:`Exposition.parse`)."""
    return Exposition().parse(text, content_type)


def _parse_block(block: str) -> tuple[list[Sample], int]:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return _samples(text_string_to_metric_families(block if block.endswith("\n") else block + "\n")), 0
    except Exception:  # the parser's errors are ValueError, and worse on hostile text
        pass
    out: list[Sample] = []
    bad = 0
    for line in block.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        try:
            out += _samples(text_string_to_metric_families(s + "\n"))
        except Exception:
            bad += 1
    return out, bad


def _samples(families: Iterable[Any]) -> list[tuple[str, str, float]]:
    out = []
    for fam in families:
        for s in fam.samples:
            if s.name.endswith(SKIPPED_SUFFIXES):
                continue
            out.append((s.name, json.dumps(s.labels, sort_keys=True, separators=(",", ":")), float(s.value)))
    return out


@dataclass
class ScrapeStats:
    """What a scraper did (stderr summary, tests, the benchmark)."""

    scrapes: int = 0
    failures: int = 0
    rows: int = 0
    malformed_lines: int = 0
    #: CPU seconds the scraping thread used (time.thread_time): what scraping costs the host
    cpu_s: float = 0.0
    #: of which the first scrape (imports, the connection): the one-time part
    first_cpu_s: float = 0.0
    #: why scraping stopped before the run ended, or None
    stopped: str | None = None
    warnings: list[str] = field(default_factory=list)


def _stderr(message: str) -> None:
    try:
        echo(f"tracetool: {message}", err=True)  # the message quotes the server
    except (OSError, ValueError):
        pass


class MetricsScraper:
    """Scrapes ``url`` every ``interval_s`` on a daemon thread and hands the rows to ``emit``.

    Args:
        url: the metrics URL (see :func:`metrics_url`).
        emit: called with each scrape's rows ``(ts_ns, name, labels, value, clock)``; its
            exceptions are counted, never raised.
        clock: ``"client"``, ``"server"`` or ``"scraper"``: which clock ``now`` reads (the
            ``clock`` column).
        now: the timestamp source, Unix-epoch nanoseconds (the probe's client clock).
        interval_s: seconds between the starts of two scrapes.
        timeout_s: longest one scrape may take, connection and whole body included
            (default: twice the interval, at least 2 s and at most 10 s).
        warn: where the one-line warnings go (default: stderr, ``tracetool: ...``).
    """

    def __init__(self, url: str, emit: Callable[[list[Row]], None], *, clock: str = "client",
                 now: Callable[[], int] = time.time_ns, interval_s: float = DEFAULT_INTERVAL_S,
                 timeout_s: float | None = None, max_bytes: int = MAX_METRICS_BYTES,
                 warn: Callable[[str], None] = _stderr, headers: dict[str, str] | None = None) -> None:
        if not interval_s > 0 or math.isinf(interval_s):
            raise ValueError("interval_s must be > 0")
        self.url = url
        self.emit = emit
        self.clock = clock
        self.now = now
        self.interval_s = interval_s
        self.timeout_s = timeout_s if timeout_s is not None else min(10.0, max(2.0, 2 * interval_s))
        self.max_bytes = max_bytes
        self._warn = warn
        self._headers = dict(headers or {})
        self.stats = ScrapeStats()
        self._said: set[str] = set()
        self._exposition = Exposition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._final = False
        #: whether the latest scrape got an answer (no last scrape at the end after a failed one)
        self._last_ok = False
        self._client: Any = None
        #: set once the first scrape has been tried (whatever came of it)
        self.first = threading.Event()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> MetricsScraper:
        self._thread = threading.Thread(target=self._run, name="tracetool-metrics-scraper", daemon=True)
        self._thread.start()
        return self

    def stop(self, final_scrape: bool = True) -> ScrapeStats:
        """Stop, after one last scrape unless scraping gave up or the latest scrape failed: the
        counters' values at the end of the run. Waits at most two scrape timeouts; a scrape
        still hanging then is abandoned (the thread is a daemon, its rows are never emitted)."""
        if self._closed:
            return self.stats
        self._closed = True
        self._final = final_scrape
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(2 * self.timeout_s + 1.0)
            if t.is_alive():
                self._final = False
        return self.stats

    def __enter__(self) -> MetricsScraper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    # -- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        import httpx

        cpu0 = time.thread_time()
        try:
            # plain http needs no certificates: loading the CA bundle costs more than many scrapes
            with httpx.Client(timeout=httpx.Timeout(self.timeout_s), trust_env=False,
                              verify=self.url.startswith("https:"), follow_redirects=True,
                              headers={"Accept": "text/plain;version=0.0.4;q=0.9,*/*;q=0.1", **self._headers},
                              ) as client:
                self._client = client
                next_at = time.monotonic()
                while not self._stop.is_set():
                    self.scrape_once()
                    self.stats.cpu_s = time.thread_time() - cpu0
                    if not self.first.is_set():
                        self.stats.first_cpu_s = self.stats.cpu_s
                        self.first.set()
                    next_at += self.interval_s
                    now = time.monotonic()
                    if next_at < now:  # a slow scrape: skip the missed ticks, never burst
                        next_at = now + self.interval_s - (now - next_at) % self.interval_s
                    self._stop.wait(next_at - now)
                if self._final and self.stats.stopped is None and self._last_ok:
                    self._scrape(client, final=True)
        except Exception as e:  # never into the host: say it, stop
            self._say("crash", f"metrics scraper stopped: {type(e).__name__}: {_line(e)}")
            self.stats.stopped = self.stats.stopped or "error"
        finally:
            self._client = None
            self.first.set()
            self.stats.cpu_s = time.thread_time() - cpu0

    def scrape_once(self) -> int:
        """One scrape: fetch, parse, emit. Returns the rows emitted (0 on any failure)."""
        import httpx

        client = self._client
        own = client is None
        if own:
            client = httpx.Client(timeout=httpx.Timeout(self.timeout_s), trust_env=False)
        try:
            return self._scrape(client)
        finally:
            if own:
                client.close()

    def _scrape(self, client: Any, final: bool = False) -> int:
        import httpx

        self.stats.scrapes += 1
        try:
            status, ctype, body, cut = self._fetch(client, final)
        except (httpx.HTTPError, TimeoutError, OSError) as e:
            if self._stop.is_set() and not final:
                return 0  # cut short by stop(): the last scrape follows
            self._last_ok = False
            self.stats.failures += 1
            kind = "timeout" if isinstance(e, (httpx.TimeoutException, TimeoutError)) else "unreachable"
            self._say(kind, f"metrics scrape of {self.url} failed ({_line(e) or type(e).__name__}); "
                            f"retrying every {self.interval_s:g} s (said once)")
            return 0
        ts = self.now()
        if status >= 500:
            self._last_ok = False
            self.stats.failures += 1
            self._say("5xx", f"metrics scrape of {self.url}: HTTP {status}; retrying every "
                             f"{self.interval_s:g} s (said once)")
            return 0
        if status >= 400:
            return self._give_up(f"HTTP {status}: no engine metrics there (docs/serving.md says how each "
                                 "engine turns /metrics on)")
        if cut:
            return self._give_up(f"the body is over {self.max_bytes >> 20} MiB: not an engine's metrics page")
        if "html" in ctype.lower() or body.lstrip()[:1] == b"<":
            return self._give_up("it answered an HTML page, not Prometheus metrics")
        try:
            samples, bad = self._exposition.parse(body.decode("utf-8", "replace"), ctype)
        except NotMetrics as e:
            return self._give_up(str(e))
        self._last_ok = True
        if bad:
            self.stats.malformed_lines += bad
            self._say("malformed", f"metrics from {self.url}: {bad} malformed line(s) skipped, the rest kept "
                                   "(said once)")
        if (self._stop.is_set() and not final) or not samples:
            return 0
        rows = [(ts, name, labels, value, self.clock) for name, labels, value in samples]
        try:
            self.emit(rows)
        except Exception as e:
            self.stats.failures += 1
            self._say("emit", f"metrics rows not written: {type(e).__name__}: {_line(e)} (said once)")
            return 0
        self.stats.rows += len(rows)
        return len(rows)

    def _fetch(self, client: Any, final: bool = False) -> tuple[int, str, bytes, bool]:
        """(status, content type, body, cut at max_bytes) within timeout_s in all (a dripping body too)."""
        deadline = time.monotonic() + self.timeout_s
        with client.stream("GET", self.url) as resp:
            parts: list[bytes] = []
            n = 0
            for part in resp.iter_bytes():
                parts.append(part)
                n += len(part)
                if n > self.max_bytes:
                    return resp.status_code, resp.headers.get("content-type", ""), b"", True
                if time.monotonic() > deadline or (self._stop.is_set() and not final):
                    raise TimeoutError(f"no complete answer in {self.timeout_s:g} s")
                if resp.status_code >= 400 and n >= 4096:
                    break  # enough of an error page
            return resp.status_code, resp.headers.get("content-type", ""), b"".join(parts), False

    def _give_up(self, why: str) -> int:
        self.stats.failures += 1
        self.stats.stopped = why
        self._say("stop", f"metrics scraping of {self.url} stopped: {why}; the run goes on without engine metrics")
        self._stop.set()
        return 0

    def _say(self, key: str, message: str) -> None:
        if key in self._said:
            return
        self._said.add(key)
        self.stats.warnings.append(message)
        try:
            self._warn(message)
        except Exception:
            pass


def _line(e: BaseException) -> str:
    return one_line(e, 200)


def recorder_emit(recorder: Any) -> Callable[[list[Row]], None]:
    """An ``emit`` that appends rows to a :class:`collectors.recorder.Recorder`'s ``server_metrics``."""
    sink = recorder.sink("server_metrics")

    def emit(rows: list[Row]) -> None:
        if recorder.enabled:
            for row in rows:
                sink.append(row)

    return emit


def attach_scraper(recorder: Any, url: str, *, clock: str, interval_s: float = DEFAULT_INTERVAL_S,
                   now: Callable[[], int] = time.time_ns, first_wait_s: float = 2.0) -> MetricsScraper:
    """Start a scraper writing into ``recorder``'s trace; it stops before the trace closes.

    Waits up to ``first_wait_s`` for the first scrape, so that the counters of the run have a
    baseline taken before its first request. The URL, interval, clock and, at the end, what
    the scraper did are written to meta.json (``server_metrics``)."""
    info: dict[str, Any] = {"url": url, "interval_s": interval_s, "clock": clock,
                            "timestamps": "the scraping host's clock when each scrape's response arrived"}
    recorder.writer.update_meta(server_metrics=info)
    scraper = MetricsScraper(url, recorder_emit(recorder), clock=clock, interval_s=interval_s, now=now)

    def stop() -> None:
        st = scraper.stop()
        recorder.writer.update_meta(server_metrics={**info, "scrapes": st.scrapes, "failures": st.failures,
                                                    "rows": st.rows, "stopped": st.stopped})

    recorder.on_close(stop)
    scraper.start()
    scraper.first.wait(first_wait_s)
    return scraper


def scrape_into_writer(writer: Any, url: str, *, clock: str, interval_s: float = DEFAULT_INTERVAL_S,
                       first_wait_s: float = 2.0) -> Callable[[], None]:
    """Scrape ``url`` into a :class:`tracetool.writer.TraceWriter`'s ``server_metrics`` (no
    recorder: ``tracetool attach --record``); returns the stop, which records in meta.json what
    the scraper did."""
    sink = writer.sink("server_metrics")

    def emit(rows: list[Row]) -> None:
        for row in rows:
            sink.append(row)

    info: dict[str, Any] = {"url": url, "interval_s": interval_s, "clock": clock,
                            "timestamps": "the scraping host's clock when each scrape's response arrived"}
    writer.update_meta(server_metrics=info)
    scraper = MetricsScraper(url, emit, clock=clock, interval_s=interval_s).start()
    scraper.first.wait(first_wait_s)

    def stop() -> None:
        st = scraper.stop()
        writer.update_meta(server_metrics={**info, "scrapes": st.scrapes, "failures": st.failures, "rows": st.rows,
                                           "stopped": st.stopped})

    return stop
