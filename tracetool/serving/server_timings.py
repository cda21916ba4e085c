"""Per-request timings that unmodified servers put in their responses, mapped to tracetool's phases.

A server that never heard of tracetool may still say how long it spent on a
request, in the response itself. The probe reads three forms (besides the
``Server-Timing`` header, parsed in :mod:`tracetool.serving.sse`):

* **llama.cpp** (``llama-server``, source read: ``tools/server/server-task.cpp``
  and ``server-context.cpp``, late 2026): a ``timings`` object on the last chunk
  of a stream (the usage chunk when ``stream_options.include_usage`` is set, else
  the chunk with ``finish_reason``; on every chunk, cumulative, with
  ``timings_per_token``) and in a non-streamed body. ``prompt_ms`` runs from the
  slot starting to process the prompt to the first sampled token: that is
  **prefill**. ``predicted_ms`` runs from that first token to the last: **decode**.
  ``prompt_n`` counts the prompt tokens processed (the cached ones are in
  ``cache_n``), ``predicted_n`` the tokens generated. No queue, no total: a
  request waiting for a free slot is not in either.
* **vLLM** (``--enable-per-request-metrics`` and the request field
  ``include_metrics: true``, v0.25+, source read:
  ``build_per_request_timing_metrics`` in ``vllm/entrypoints/openai``): a
  ``metrics`` object on the final usage chunk (so ``include_usage`` is needed
  too) or in the body. ``queue_time_ms`` is queued → scheduled (**queue**),
  ``time_to_first_token_ms`` is, despite its name, scheduled → first token
  (**prefill**, the engine's part of TTFT), ``generation_time_ms`` is first →
  last token (**decode**).
* **tracetool's middleware**: a ``server_timing`` object of phase → ms.

Every value is a duration the server measured on its own clock; nothing here
compares server timestamps with client ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

#: Longest duration taken as a timing (about 11.6 days, in ms): beyond it a number is no timing
#: (and its nanoseconds would not fit a trace's int64 columns). Same bound as the SSE parser's.
MAX_DURATION_MS = 1e9

#: llama.cpp ``timings`` key -> phase.
LLAMA_CPP = {"prompt_ms": "prefill", "predicted_ms": "decode"}
#: vLLM per-request ``metrics`` key -> phase.
VLLM = {"queue_time_ms": "queue", "time_to_first_token_ms": "prefill", "generation_time_ms": "decode"}

#: The name of each source, as the probe's report and docs say it.
SOURCE_LLAMA_CPP = "llama.cpp timings"
SOURCE_VLLM = "vLLM metrics"
SOURCE_MIDDLEWARE = "server_timing field"
SOURCE_HEADER = "Server-Timing header"


@dataclass
class Reported:
    """What one event of a response reported: phase durations (ms), token counts, where from."""

    phases: dict[str, float] = field(default_factory=dict)
    source: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None


def duration_ms(v: Any) -> float | None:
    """A server-reported duration in ms when it is a number in [0, MAX_DURATION_MS], else None."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    try:
        ms = float(v)
    except OverflowError:  # a JSON integer with hundreds of digits
        return None
    return ms if math.isfinite(ms) and 0 <= ms <= MAX_DURATION_MS else None


def count(v: Any) -> int | None:
    """A token count when it fits the trace's int32 columns (else None: the row would be lost)."""
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 30:
        return v
    return None


def from_event(obj: dict[str, Any]) -> Reported | None:
    """The timings one JSON event (or a non-streamed body) carries, or None when it carries none.

    One event carries one form; were there several, tracetool's own field wins, then
    llama.cpp's, then vLLM's (the first found, so a later form never half-overwrites it).
    """
    st = obj.get("server_timing")
    if isinstance(st, dict):
        phases = {str(k): ms for k, v in st.items() if (ms := duration_ms(v)) is not None}
        if phases:
            return Reported(phases, SOURCE_MIDDLEWARE)
    t = obj.get("timings")
    if isinstance(t, dict):
        phases = {LLAMA_CPP[k]: ms for k in LLAMA_CPP if (ms := duration_ms(t.get(k))) is not None}
        if phases:
            prompt_n, cache_n = count(t.get("prompt_n")), count(t.get("cache_n"))
            prompt = None if prompt_n is None else prompt_n + (cache_n or 0)
            return Reported(phases, SOURCE_LLAMA_CPP, prompt if prompt is None or prompt < 1 << 30 else None,
                            count(t.get("predicted_n")))
    m = obj.get("metrics")
    if isinstance(m, dict):
        phases = {VLLM[k]: ms for k in VLLM if (ms := duration_ms(m.get(k))) is not None}
        if phases:
            return Reported(phases, SOURCE_VLLM)
    return None
