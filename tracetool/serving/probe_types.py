"""The probe's types: what to send (:class:`ProbeConfig`), one request as the client saw it
(:class:`RequestResult`) and a run's outcome (:class:`ProbeResult`).

In a module of their own, so the probe's helpers (its HTTP reading, its trace rows, its events,
its report) and the command line import them without importing the probe, and each default is
declared once: the workload's in :class:`~tracetool.serving.workloads.WorkloadSpec`, the rest
here; ``tracetool probe``'s options read them with :func:`default`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracetool.serving.workloads import WorkloadSpec
from tracetool.untrusted import clip

if TYPE_CHECKING:  # the event loop's module and numpy's, kept off the command line's start-up
    from tracetool.serving.metrics import Timing
    from tracetool.serving.schedule import LoopStats


@dataclass(kw_only=True)
class ProbeConfig(WorkloadSpec):
    """What to send. See ``tracetool probe --help`` for each option; the workload's own fields
    (``n``, ``prompt_tokens``, ``dataset``, ``replay``, ``input_len``, ...) are
    :class:`~tracetool.serving.workloads.WorkloadSpec`'s, declared there once."""

    url: str
    concurrency: int = 4
    rate: float | None = None
    #: shape of the gamma-distributed gaps between arrivals (1 = Poisson, inf = evenly spaced)
    burstiness: float = 1.0
    max_tokens: int = 32
    chat: bool | None = None
    model: str | None = None
    api_key: str | None = None
    timeout_s: float = 120.0
    ignore_eos: bool = False
    include_usage: bool = True
    #: a local tokenizer (directory or tokenizer.json): prompt lengths where the server gives none
    tokenizer: Path | None = None
    #: the run's shape: how long (s), the warm-up excluded from the figures (s), the rate's ramp (s)
    duration_s: float | None = None
    warmup_s: float = 0.0
    ramp_s: float = 0.0
    out: Path | None = None
    progress: bool = True
    #: scrape the server's Prometheus metrics into the trace (a URL, or "auto": origin + /metrics)
    metrics_url: str | None = None
    metrics_interval_s: float = 1.0


def default(name: str) -> Any:
    """A probe option's default, from the one place it is declared (the CLI's options read it)."""
    f = ProbeConfig.__dataclass_fields__[name]
    return f.default


@dataclass
class RequestResult:
    """One request as the client saw it (client-clock nanoseconds)."""

    index: int
    request_id: str
    prompt_chars: int
    start_ns: int = 0
    #: when the schedule said to send it (client clock); None in a closed-loop run (no schedule)
    intended_ns: int | None = None
    #: when the probe's loop got round to it (client clock): past intended_ns by the loop's lateness;
    #: from here to start_ns it waited for a concurrency slot
    dispatched_ns: int | None = None
    end_ns: int = 0
    last_chunk_ns: int = 0
    token_ns: list[int] = field(default_factory=list)
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    #: prompt tokens the server served from its prefix cache (usage.prompt_tokens_details)
    cached_prompt_tokens: int | None = None
    #: reasoning tokens as the server's usage reports them (completion_tokens_details)
    reasoning_tokens: int | None = None
    #: chunks that carried reasoning_content (or reasoning): tokens, counted apart
    reasoning_chunks: int = 0
    #: the prompt's length by --tokenizer, for servers whose usage gives none
    local_prompt_tokens: int | None = None
    #: due within --warmup: recorded in OUT/warmup, left out of the report and the analysis
    warmup: bool = False
    #: keep the answer's text (a turn whose answer the next turn carries as history)
    keep_text: bool = False
    text: list[str] = field(default_factory=list)
    http_status: int | None = None
    error: str | None = None
    connect: tuple[int, int] | None = None
    tls: tuple[int, int] | None = None
    server_timing: dict[str, float] | None = None
    #: where the server's timings came from (server_timings.SOURCE_*), in the order seen
    timing_sources: list[str] = field(default_factory=list)
    #: token counts from the server's timings (llama.cpp), used where usage gave none
    reported_prompt_tokens: int | None = None
    reported_output_tokens: int | None = None
    finish_reason: str | None = None
    done: bool = False
    reached: bool = False
    unreachable: bool = False
    #: a first attempt that failed on a pooled connection closed before any response byte:
    #: (start, end) on the client clock, and why; the request was then sent again on a new connection
    retry: tuple[int, int, str] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def fail(self, message: str) -> None:
        if self.error is None:
            self.error = clip(message, 500)

    @property
    def counted_output_tokens(self) -> int | None:
        """The request's output tokens as the trace records them and TPOT divides by: the server's
        usage, else the count its timings gave (llama.cpp), else the content chunks received."""
        if self.output_tokens is not None:
            return self.output_tokens
        if self.reported_output_tokens is not None:
            return self.reported_output_tokens
        return len(self.token_ns) if self.reached else None

    @property
    def timing(self) -> Timing:
        """What the client saw, for the latency figures: from the intended send time where the run had
        a schedule, to the end of the response, as the trace's client.queue and client.request spans
        (``analyze`` computes the same figures from those)."""
        from tracetool.serving.metrics import Timing

        return Timing(self.intended_ns if self.intended_ns is not None else self.start_ns, self.token_ns,
                      max(self.end_ns, self.start_ns), self.counted_output_tokens)

    def new_attempt(self) -> RequestResult:
        """A result for sending this request again: who it is and when it was due (its schedule,
        its warm-up flag), nothing the last attempt saw."""
        return RequestResult(self.index, self.request_id, self.prompt_chars, intended_ns=self.intended_ns,
                             dispatched_ns=self.dispatched_ns, local_prompt_tokens=self.local_prompt_tokens,
                             keep_text=self.keep_text, warmup=self.warmup)

    def become(self, attempt: RequestResult) -> None:
        """Take every field of ``attempt`` (the request's outcome is its last attempt's), in place:
        the run's list of results keeps this object."""
        for f in fields(self):
            setattr(self, f.name, getattr(attempt, f.name))


@dataclass
class ProbeResult:
    config: ProbeConfig
    base_url: str
    model: str
    chat: bool
    results: list[RequestResult]
    wall_s: float
    out: Path | None
    #: the TCP handshake of the model-list request (client clock): with keep-alive, the first
    #: request reuses that connection, so at concurrency 1 it is the run's only RTT sample
    setup_connect: tuple[int, int] | None = None
    #: the probe's own health: event-loop lag and CPU (None when not monitored)
    loop: LoopStats | None = None
    cpu_share: float | None = None
    #: what was sent: source, file, lengths (exact by a tokenizer, or approximate), as in meta.json
    workload: dict[str, Any] | None = None


__all__ = ["ProbeConfig", "ProbeResult", "RequestResult", "default"]
