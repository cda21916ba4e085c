"""What each server's spans say, as tracetool's phases on the server's clock.

docs/otlp.md is the user-facing version of this module, with the source
version each mapping was read from. In short:

* **vLLM** ``llm_request`` (``vllm/v1/engine/output_processor.py``,
  ``do_tracing``): a SERVER span starting at the request's arrival, with
  durations in seconds as attributes. ``server.request`` = start → start +
  ``gen_ai.latency.e2e``; the first token exists at start +
  ``time_to_first_token``; ``prefill`` (``time_in_model_prefill``) ends
  there, ``queue`` (``time_in_queue``) ends where prefill starts, ``decode``
  (``time_in_model_decode``) starts there. ``time_in_model_inference`` fills a
  missing prefill or decode (inference = prefill + decode).
* **vLLM journey tracing** (``--enable-journey-tracing``): ``llm_request``
  with ``api.*`` events gives ``server.request`` (ARRIVED → DEPARTED/ABORTED);
  its child ``llm_core`` with ``journey.*`` events gives ``queue`` (QUEUED →
  SCHEDULED, and PREEMPTED → SCHEDULED again), ``prefill`` (SCHEDULED →
  FIRST_TOKEN) and ``decode`` (FIRST_TOKEN → FINISHED, less time preempted).
* **SGLang** (``--enable-trace``): a ``Req <rid>`` root span per request
  (``rid`` attribute) gives ``server.request``; the stage slices directly
  under its thread spans give ``tokenize``, ``queue``
  (``prefill_waiting``/``decode_waiting``), ``prefill`` (``prefill_forward``)
  and ``decode`` (``decode_forward``, or ``decode_loop`` where it is a
  top-level slice).
* **TGI** router spans (``generate``, ``generate_stream``,
  ``chat_completions``, ...): ``total_time``, ``validation_time``,
  ``queue_time``, ``inference_time`` recorded as Rust ``Duration`` debug
  strings (``"12.3ms"``): ``server.request``, ``tokenize`` (validation, which
  tokenizes), ``queue``; inference is prefill and decode together, which the
  router span does not split: it becomes ``otlp:inference`` (counted in
  ``other``), and prefill and decode stay not measured.
* **OpenTelemetry GenAI conventions**: a SERVER span with
  ``gen_ai.operation.name`` gives ``server.request`` and usage; any span with
  ``gen_ai.latency.*`` attributes is read as vLLM's.

Everything else in a request's trace is kept as a span named ``otlp:<name>``
(the attribution counts it in ``other``): never a standard phase name by
accident.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tracetool.otlp.decode import MAX_NS, OtelSpan
from tracetool.untrusted import clip

#: Name prefix of spans kept as they came (not read as a phase).
KEPT_PREFIX = "otlp:"
#: A reported duration above this is not believed (seconds).
MAX_SECONDS = 1e6

LAT = "gen_ai.latency."
_SGLANG_ROOT = re.compile(r"^(?:\S+ )?Req [0-9A-Za-z_-]+$")
_SGLANG_PHASES = {"tokenize": "tokenize", "prefill_waiting": "queue", "decode_waiting": "queue",
                  "prefill_forward": "prefill", "decode_forward": "decode", "decode_loop": "decode"}
_RUST_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ns|µs|us|ms|s)\s*$")
_RUST_UNITS = {"ns": 1, "µs": 1_000, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


@dataclass
class Rows:
    """What one span (or a request's root) contributes to the trace."""

    #: (request_id, name, start_ns, end_ns), server clock
    spans: list[tuple[str, str, int, int]] = field(default_factory=list)
    #: request_id -> requests-table fields (prompt_tokens, output_tokens, status, error)
    requests: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: (request_id, preemptions) from vLLM's journey events
    preemptions: list[tuple[str, int]] = field(default_factory=list)
    #: attributes present but unusable (negative, not a number, absurd): one line each
    unusable: list[str] = field(default_factory=list)

    def span(self, rid: str, name: str, start: int, end: int) -> None:
        # a reported duration added to a start near the end of int64 must not overflow the column
        start = min(max(int(start), 0), MAX_NS)
        self.spans.append((rid, name, start, min(max(start, int(end)), MAX_NS)))


@dataclass(frozen=True)
class Root:
    """A span that stands for one request: which server shape, and the server's own id for it."""

    kind: str  # vllm, vllm-journey, sglang, tgi, genai
    request_id: str | None  # None: the server names none (the trace id stands in)


def request_root(span: OtelSpan) -> Root | None:
    """Whether ``span`` is the root of one request in a server's spans, and of which shape."""
    a = span.attributes
    if span.name == "llm_request":
        rid = _str(a.get("gen_ai.request.id"))
        if any(e.name.startswith("api.") for e in span.events) and not _has_latency(a):
            return Root("vllm-journey", rid)
        return Root("vllm", rid)
    if "rid" in a and _SGLANG_ROOT.match(span.name):
        return Root("sglang", _str(a.get("rid")))
    if _tgi_times(a) is not None:
        return Root("tgi", None)
    if span.kind != "client" and (_has_latency(a) or (span.kind == "server" and "gen_ai.operation.name" in a)):
        return Root("genai", _str(a.get("gen_ai.request.id")) or _str(a.get("gen_ai.response.id")))
    return None


def map_root(span: OtelSpan, root: Root, rid: str, *, children_give_phases: bool) -> tuple[Rows, bool]:
    """Rows of a request's root span; returns them and whether the root gave the phases itself
    (else its children may: vLLM's ``llm_core``, SGLang's slices)."""
    rows = Rows()
    a = span.attributes
    info = rows.requests.setdefault(rid, {})
    _usage(a, info, rows)
    info["status"] = "error" if span.status == "error" else "ok"
    if span.status == "error":
        info["error"] = span.status_message or f"{span.name}: span status error"
    gave = False
    if root.kind == "vllm-journey":
        start, end = span.start_ns, span.end_ns
        for ev in span.events:
            if ev.name.endswith("ARRIVED"):
                start = ev.time_ns
            elif ev.name.endswith(("DEPARTED", "ABORTED")):
                end = ev.time_ns
                if ev.name.endswith("ABORTED"):
                    info.update(status="error", error="vLLM: request aborted")
        rows.span(rid, "server.request", start, end)
    elif root.kind == "tgi":
        gave = _tgi(span, rid, rows)
    elif _has_latency(a) and not children_give_phases:
        gave = _latency_attributes(span, rid, rows)
        # the span starts at the engine's arrival and ends at its finish: the API server's HTTP
        # handling, chat template, tokenization and streaming lie outside it (vLLM #29180)
        info["server_scope"] = "engine"
    else:
        rows.span(rid, "server.request", span.start_ns, span.end_ns)
    return rows, gave


def map_child(span: OtelSpan, rid: str, parent_name: str | None, *, root_gave_phases: bool) -> tuple[Rows, str]:
    """Rows of a span under a request's root; returns them and the mapping used."""
    rows = Rows()
    if not root_gave_phases:
        if span.name == "llm_core" and any(e.name.startswith("journey.") for e in span.events):
            _journey(span, rid, rows)
            return rows, "vllm-journey"
        phase = _SGLANG_PHASES.get(span.name)
        if phase is not None and parent_name is not None and "(host:" in parent_name:
            rows.span(rid, phase, span.start_ns, span.end_ns)
            return rows, "sglang"
    rows.span(rid, KEPT_PREFIX + span.name, span.start_ns, span.end_ns)
    return rows, "child"


def gives_phases_as_child(span: OtelSpan, parent_name: str | None) -> bool:
    """Whether a child span would give phases (so its root's latency attributes are not used twice)."""
    if span.name == "llm_core" and any(e.name.startswith("journey.") for e in span.events):
        return True
    return span.name in _SGLANG_PHASES and parent_name is not None and "(host:" in parent_name


# -- the shapes ------------------------------------------------------------------------------------
def _latency_attributes(span: OtelSpan, rid: str, rows: Rows) -> bool:
    """vLLM's ``llm_request`` (and any span with ``gen_ai.latency.*``): durations placed from the
    span's start, which is the request's arrival. Reported durations are kept exactly; only where
    they sit is moved, when the reported numbers do not fit inside each other."""
    a = span.attributes
    s = span.start_ns
    e2e = _seconds(a, LAT + "e2e", rows)
    ttft = _seconds(a, LAT + "time_to_first_token", rows)
    queue = _seconds(a, LAT + "time_in_queue", rows)
    prefill = _seconds(a, LAT + "time_in_model_prefill", rows)
    decode = _seconds(a, LAT + "time_in_model_decode", rows)
    inference = _seconds(a, LAT + "time_in_model_inference", rows)
    if inference is not None:
        if prefill is None and decode is not None:
            prefill = max(0, inference - decode)
        elif decode is None and prefill is not None:
            decode = max(0, inference - prefill)
    end = s + e2e if e2e is not None else span.end_ns
    rows.span(rid, "server.request", s, end)
    first = s + ttft if ttft is not None else s + (queue or 0) + (prefill or 0)
    # prefill ends at the first token, queue ends where prefill starts; never before arrival
    p0 = max(s + (queue or 0), first - (prefill or 0))
    if queue is not None:
        rows.span(rid, "queue", p0 - queue, p0)
    if prefill is not None:
        rows.span(rid, "prefill", p0, p0 + prefill)
    if decode is not None:
        d0 = p0 + (prefill or 0)
        d0 = min(d0, max(s, end - decode))  # inside server.request when the numbers allow it
        rows.span(rid, "decode", d0, d0 + decode)
    return any(x is not None for x in (queue, prefill, decode))


def _journey(span: OtelSpan, rid: str, rows: Rows) -> None:
    """vLLM's ``llm_core`` journey events as queue / prefill / decode intervals."""
    waiting_since: int | None = None
    running_since: int | None = None
    first_token = False
    preemptions = 0
    for ev in sorted(span.events, key=lambda e: e.time_ns):
        kind = ev.name.rsplit(".", 1)[-1].upper()
        t = ev.time_ns
        n = ev.attributes.get("num_preemptions")
        if isinstance(n, int) and not isinstance(n, bool):
            preemptions = max(preemptions, n)
        if kind == "QUEUED":
            waiting_since = t
        elif kind == "SCHEDULED":
            if waiting_since is not None:
                rows.span(rid, "queue", waiting_since, t)
            waiting_since, running_since = None, t
        elif kind == "FIRST_TOKEN":
            if running_since is not None:
                rows.span(rid, "prefill", running_since, t)
            running_since, first_token = t, True
        elif kind in ("PREEMPTED", "FINISHED"):
            if running_since is not None:
                rows.span(rid, "decode" if first_token else "prefill", running_since, t)
            running_since = None
            if kind == "PREEMPTED":
                preemptions = max(preemptions, 1)
                waiting_since = t
            else:
                waiting_since = None
    if preemptions:
        rows.preemptions.append((rid, preemptions))


def _tgi(span: OtelSpan, rid: str, rows: Rows) -> bool:
    times = _tgi_times(span.attributes)
    assert times is not None
    s = span.start_ns
    total = times.get("total_time")
    rows.span(rid, "server.request", s, s + total if total is not None else span.end_ns)
    t = s
    if (v := times.get("validation_time")) is not None:
        rows.span(rid, "tokenize", t, t + v)
        t += v
    if (q := times.get("queue_time")) is not None:
        rows.span(rid, "queue", t, t + q)
        t += q
    if (i := times.get("inference_time")) is not None:
        rows.span(rid, KEPT_PREFIX + "inference", t, t + i)
    return True


def _tgi_times(a: Mapping[str, Any]) -> dict[str, int] | None:
    """TGI's recorded durations, ns, when the span has them (queue and inference at least)."""
    out = {}
    for key in ("total_time", "validation_time", "queue_time", "inference_time"):
        v = a.get(key)
        if isinstance(v, str) and (m := _RUST_DURATION.match(v)):
            out[key] = int(float(m.group(1)) * _RUST_UNITS[m.group(2)])
    return out if "queue_time" in out and "inference_time" in out else None


# -- attribute helpers ---------------------------------------------------------------------------------
def _has_latency(a: Mapping[str, Any]) -> bool:
    return any(k.startswith(LAT) for k in a)


def _seconds(a: Mapping[str, Any], key: str, rows: Rows) -> int | None:
    """A duration attribute in seconds, as ns; None when absent or unusable (said once in a note)."""
    v = a.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= MAX_SECONDS:
        rows.unusable.append(f"{key}={clip(repr(v), 40)}")
        return None
    return round(v * 1e9)


def _usage(a: Mapping[str, Any], info: dict[str, Any], rows: Rows) -> None:
    for col, keys in (("prompt_tokens", ("gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens")),
                      ("output_tokens", ("gen_ai.usage.completion_tokens", "gen_ai.usage.output_tokens"))):
        for k in keys:
            v = a.get(k)
            if v is None:
                continue
            if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 31:
                info[col] = v
                break
            rows.unusable.append(f"{k}={clip(repr(v), 40)}")


def _str(v: Any) -> str | None:
    if v is None or isinstance(v, (dict, list)):
        return None
    s = str(v).strip()
    return clip(s, 256) or None
