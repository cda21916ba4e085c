"""The trace format v1: the one contract every part of tracetool reads and writes.

A trace is a directory holding ``meta.json`` and one file (or several segments)
per table. This module is the single source of truth for the tables, their
columns, types and units; ``docs/trace-format.md`` documents the same contract
for people who write traces with nothing but pyarrow, and a test keeps the two
in step.

Units live in column names: ``_ns`` nanoseconds, ``_pct`` percent (0-100),
``_bytes`` bytes, ``_w`` watts, ``_mhz`` megahertz.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import pyarrow as pa

FORMAT = "tracetool"
VERSION = 1
META_FILE = "meta.json"

#: File kinds a table may be stored in, by extension.
EXTENSIONS = ("arrows", "arrow", "parquet")

#: ``<table>.<ext>`` or a segment ``<table>-<suffix>.<ext>``.
TABLE_FILE_RE = re.compile(r"^(?P<table>[a-z_][a-z0-9_]*)(?:-(?P<suffix>[^/]+?))?\.(?P<ext>"
                           + "|".join(EXTENSIONS) + ")$")

CLOCKS = ("server", "client")
#: Clocks of ``server_metrics.clock``: a scraper may run on a host of its own.
METRICS_CLOCKS = ("client", "server", "scraper")

#: Standard span names. Other names are allowed and kept (counted as ``other``
#: by the analyzers unless they start with one of these).
CLIENT_REQUEST = "client.request"
SERVER_REQUEST = "server.request"
#: A load client's wait between a request's intended send time and its send (tracetool probe --rate).
CLIENT_QUEUE = "client.queue"
#: The server phases in the order a request meets them on its timeline (pre-processing and the
#: chat template, tokenization, waiting for the engine, the prompt, the tokens, then back to text
#: and post-processing): the one place that order is spelled. Prefill ends at the first token.
PHASES = ("preprocess", "tokenize", "queue", "prefill", "decode", "detokenize", "postprocess")
#: The phases before the first token exists, and from it on (serving order around it).
PHASES_BEFORE_FIRST_TOKEN = PHASES[:PHASES.index("prefill") + 1]
PHASES_FROM_FIRST_TOKEN = PHASES[PHASES.index("prefill") + 1:]
#: Components of the attribution rule, in the order every output lists them (``analyze --json``'s
#: ``components``, documented in docs/analysis-json.md; the reports, the TUI, ``diff``): the time
#: outside the server, then the server phases, then ``other``. This is the report's row order, not
#: the serving order: the phases before prefill come the other way round from :data:`PHASES`
#: (``queue`` first), as the contract has listed them since version 1, and reordering them would
#: reorder every report. ``analyzers/attribution.sql`` mirrors this tuple; tests/unit/test_phase_order.py
#: pins how it relates to PHASES, to the SQL and to the docs.
COMPONENTS = ("client_queue", "network", "frontend", "queue", "tokenize", "preprocess", "prefill", "decode",
              "detokenize", "postprocess", "other")
#: Components only some traces can measure: ``client_queue`` a scheduled load run (``client.queue``
#: spans of ``tracetool probe --rate``), ``frontend`` a server whose ``server.request`` is its
#: engine's span (``requests.server_scope``). Screens and reports leave them out where no request
#: measured them.
OPTIONAL_COMPONENTS = ("client_queue", "frontend")
#: What a request's ``server.request`` span covers (``requests.server_scope``): the whole HTTP request
#: as the server handled it (the default), or only its engine's span, from the engine's arrival to its
#: finish (vLLM's ``llm_request``), with the server's frontend outside it.
SERVER_SCOPES = ("server", "engine")


def shown_components(components: dict[str, dict[str, object]]) -> dict[str, dict[str, object]]:
    """The analysis's ``components`` less the optional ones no request measured."""
    return {k: v for k, v in components.items() if k not in OPTIONAL_COMPONENTS or v.get("measured")}


@dataclass(frozen=True)
class Column:
    """One column of a table: its Arrow type, whether it must be present and
    non-null, and what it means (with its unit)."""

    name: str
    type: pa.DataType
    required: bool
    doc: str

    @property
    def kind(self) -> str:
        """The type family readers accept for this column: int, float or string."""
        if pa.types.is_integer(self.type):
            return "int"
        if pa.types.is_floating(self.type):
            return "float"
        return "string"


@dataclass(frozen=True)
class Table:
    """A table of the format: its columns and what one row stands for."""

    name: str
    doc: str
    columns: tuple[Column, ...]
    #: Pairs (start, end) that must satisfy end >= start on every row.
    intervals: tuple[tuple[str, str], ...] = field(default=())

    @property
    def required(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.required)

    def column(self, name: str) -> Column | None:
        for c in self.columns:
            if c.name == name:
                return c
        return None

    @functools.cached_property
    def arrow_schema(self) -> pa.Schema:
        """Built once per table (the live endpoint decodes every batch against it)."""
        return pa.schema([pa.field(c.name, c.type, nullable=not c.required) for c in self.columns])


def _c(name: str, type_: pa.DataType, doc: str, required: bool = False) -> Column:
    return Column(name, type_, required, doc)


I32, I64, F64, STR = pa.int32(), pa.int64(), pa.float64(), pa.string()

SPANS = Table(
    "spans",
    "Request-level phases. One row per span; a request may have several spans of one name "
    "(their durations add up).",
    (
        _c("request_id", STR, "Request the span belongs to.", True),
        _c("name", STR, "Phase name: client.request, server.request, tokenize, queue, preprocess, "
           "prefill, decode, detokenize, postprocess, or any other name.", True),
        _c("start_ns", I64, "Start, nanoseconds on the clock named by `clock`.", True),
        _c("end_ns", I64, "End, nanoseconds on the clock named by `clock`; >= start_ns.", True),
        _c("clock", STR, "`server` or `client`: which clock the two timestamps are on.", True),
    ),
    intervals=(("start_ns", "end_ns"),),
)

TOKENS = Table(
    "tokens",
    "One row per generated token.",
    (
        _c("request_id", STR, "Request that generated the token.", True),
        _c("index", I32, "Position in the output: 0 = first output token (produced by prefill).", True),
        _c("emit_ns", I64, "Server clock, nanoseconds: when the token was produced.", True),
        _c("kv_len", I32, "Context length, in tokens, that the producing forward pass attended over "
           "(prompt length + index under tracetool's collectors)."),
        _c("step_start_ns", I64, "Server clock, nanoseconds: start of the forward pass that produced it."),
        _c("step_end_ns", I64, "Server clock, nanoseconds: end of that forward pass."),
        _c("batch_size", I32, "Sequences in the batch of that forward pass."),
        _c("client_recv_ns", I64, "Client clock, nanoseconds: when the client received the token."),
        _c("step_id", I64, "The `steps` row (engine iteration) that produced the token, when recorded."),
    ),
    intervals=(("step_start_ns", "step_end_ns"),),
)

GPU = Table(
    "gpu",
    "GPU samples (NVML), one row per GPU per sample.",
    (
        _c("ts_ns", I64, "Server clock, nanoseconds: when the sample was read.", True),
        _c("gpu", I32, "GPU index as NVML numbers it.", True),
        _c("sm_util_pct", F64, "SM activity, percent: GPM SM_UTIL where supported, else NVML's "
           "utilization.gpu (percent of time any kernel ran)."),
        _c("mem_util_pct", F64, "Memory controller busy, percent (NVML utilization.memory)."),
        _c("dram_bw_util_pct", F64, "DRAM bandwidth used, percent of peak (GPM DRAM_BW_UTIL, Hopper+)."),
        _c("power_w", F64, "Board power draw, watts."),
        _c("sm_clock_mhz", F64, "SM clock, megahertz."),
        _c("mem_clock_mhz", F64, "Memory clock, megahertz."),
        _c("mem_used_bytes", I64, "Device memory in use, bytes."),
        _c("gpu_util_pct", F64, "NVML utilization.gpu: percent of the sample period a kernel ran."),
        _c("sm_occupancy_pct", F64, "GPM SM_OCCUPANCY, percent (Hopper+)."),
        _c("tensor_util_pct", F64, "GPM ANY_TENSOR_UTIL, percent (Hopper+)."),
        _c("clock_event_reasons", I64, "NVML clock-event (throttle) reason bitmask."),
        _c("pcie_tx_bytes_per_s", F64, "PCIe transmit throughput, bytes per second."),
        _c("pcie_rx_bytes_per_s", F64, "PCIe receive throughput, bytes per second."),
    ),
)

STACKS = Table(
    "stacks",
    "CPU samples (py-spy), aggregated per timestamp, thread and stack.",
    (
        _c("ts_ns", I64, "Server clock, nanoseconds: when the sample was taken.", True),
        _c("thread", STR, "Thread name or id.", True),
        _c("category", STR, "tokenize, model-forward, sampling, detokenize, network-io, "
           "serialization, idle or other.", True),
        _c("stack", STR, "Folded stack, root first, frames separated by `;`.", True),
        _c("weight", I32, "Number of samples this row stands for.", True),
    ),
)

STEPS = Table(
    "steps",
    "Engine iterations of batched servers: one row per forward pass over the batch.",
    (
        _c("step_id", I64, "Iteration number, unique within the trace.", True),
        _c("start_ns", I64, "Server clock, nanoseconds: start of the iteration.", True),
        _c("end_ns", I64, "Server clock, nanoseconds: end of the iteration; >= start_ns.", True),
        _c("batch_size", I32, "Sequences in the batch.", True),
        _c("prefill_tokens", I32, "Prompt tokens processed in this iteration.", True),
        _c("decode_tokens", I32, "Tokens decoded in this iteration.", True),
        _c("kv_tokens", I64, "KV-cache tokens attended over, summed over the batch.", True),
    ),
    intervals=(("start_ns", "end_ns"),),
)

REQUESTS = Table(
    "requests",
    "Optional per-request facts that are not time spans: sizes and outcome.",
    (
        _c("request_id", STR, "Request id.", True),
        _c("prompt_tokens", I32, "Prompt length, tokens."),
        _c("output_tokens", I32, "Tokens generated."),
        _c("status", STR, "`ok` or `error`."),
        _c("error", STR, "Error message when status is `error`."),
        _c("prompt_chars", I64, "Prompt length, characters."),
        _c("cached_prompt_tokens", I32, "Prompt tokens the server served from its prefix cache "
           "(usage.prompt_tokens_details.cached_tokens), when it reports them."),
        _c("reasoning_tokens", I32, "Output tokens the server marked as reasoning "
           "(usage.completion_tokens_details.reasoning_tokens, else reasoning_content chunks); "
           "included in output_tokens."),
        _c("server_scope", STR, "What the request's `server.request` span covers: `server` (the whole HTTP "
           "request as the server handled it; the default when null) or `engine` (only the engine's span, "
           "from the engine's arrival to its finish, as vLLM's `llm_request`: HTTP handling, the chat "
           "template, tokenization before it and detokenization and streaming after it are outside)."),
    ),
)

CLOCK_OFFSETS = Table(
    "clock_offsets",
    "Optional, written by `tracetool merge`: per joined request, the estimated offset between the "
    "clocks, for drawing a joined timeline only (network time never depends on it).",
    (
        _c("request_id", STR, "Request id.", True),
        _c("offset_ns", I64, "Server clock minus client clock, nanoseconds, estimated as NTP does "
           "(symmetric delay): ((t2 - t1) + (t3 - t4)) / 2."),
        _c("network_ns", I64, "(t4 - t1) - (t3 - t2), nanoseconds: client.request minus server.request."),
    ),
)

OTLP_SPANS = Table(
    "otlp_spans",
    "Optional, written by `tracetool receive` and `tracetool import otlp`: every OpenTelemetry span "
    "received, as it came (the rows of `spans` are what tracetool read from them). It ties each "
    "request to its W3C trace id, which `tracetool merge` joins on.",
    (
        _c("trace_id", STR, "W3C trace id, 32 lowercase hex digits.", True),
        _c("span_id", STR, "Span id, 16 lowercase hex digits.", True),
        _c("parent_span_id", STR, "Parent span id; null for a root span."),
        _c("request_id", STR, "The request the span was attributed to (the server's own id, e.g. vLLM's "
           "gen_ai.request.id); null when its trace named no request."),
        _c("name", STR, "Span name as the server sent it.", True),
        _c("kind", STR, "internal, server, client, producer, consumer or unspecified."),
        _c("service", STR, "The resource's service.name."),
        _c("scope", STR, "Instrumentation scope name."),
        _c("start_ns", I64, "Start, Unix-epoch nanoseconds of the sending server's clock.", True),
        _c("end_ns", I64, "End, Unix-epoch nanoseconds of the sending server's clock; >= start_ns.", True),
        _c("status", STR, "unset, ok or error."),
        _c("mapping", STR, "How tracetool read the span: vllm, vllm-journey, tgi, sglang, genai, "
           "child (kept under its request as `otlp:<name>`) or none (no request)."),
        _c("attributes", STR, "The span's attributes as a JSON object (numbers, booleans and strings up "
           "to 256 characters; longer strings are cut, message contents are left out)."),
    ),
    intervals=(("start_ns", "end_ns"),),
)

SERVER_METRICS = Table(
    "server_metrics",
    "Optional, written when tracetool scrapes a server's Prometheus `/metrics` (`--metrics-url`): one row "
    "per sample per series per scrape, as the server exported it. Histograms and summaries appear as their "
    "`_bucket`/`_sum`/`_count` series (a bucket's bound is its `le` label), counters as their raw running "
    "totals: deltas over the measured window are the analyzers' job (analyzers/engine.sql).",
    (
        _c("ts_ns", I64, "Unix-epoch nanoseconds on the scraping host's clock (named by `clock`): when the "
           "scrape's response arrived.", True),
        _c("name", STR, "Sample name as exported, e.g. `vllm:num_requests_waiting`, "
           "`vllm:request_queue_time_seconds_bucket`.", True),
        _c("labels", STR, "The sample's labels as a JSON object with sorted keys (`{}` when none).", True),
        _c("value", F64, "Sample value, in the series' own unit (Prometheus convention: seconds, ratios 0-1).",
           True),
        _c("clock", STR, "Which clock `ts_ns` is on: `client` (the probing host's, as client spans: tracetool "
           "probe), `server` (the server's, as server spans: the scraper ran in the recording process) or "
           "`scraper` (a host of its own: aligned with neither)."),
    ),
)

TABLES: dict[str, Table] = {t.name: t for t in (SPANS, TOKENS, GPU, STACKS, STEPS, REQUESTS, CLOCK_OFFSETS,
                                                 OTLP_SPANS, SERVER_METRICS)}

#: Interned-string row layout used by the writer's integer buffers: a null in
#: an integer column travels as this sentinel and becomes a real null on flush.
INT_NULL = -(1 << 63)


def table_file_name(table: str, ext: str = "arrows", suffix: str | None = None) -> str:
    """The file name a table (or one of its segments) is stored under."""
    return f"{table}-{suffix}.{ext}" if suffix else f"{table}.{ext}"


def tables_markdown() -> str:
    """The tables section of docs/trace-format.md, generated from this module."""
    out = []
    for t in TABLES.values():
        out += [f"### `{t.name}`", "", t.doc, "", "| column | type | required | meaning |", "|---|---|---|---|"]
        out += [f"| `{c.name}` | {c.type} | {'yes' if c.required else 'no'} | {c.doc} |" for c in t.columns]
        out.append("")
        if t.intervals:
            out += [" ".join(f"Rule: `{e} >= {s}` on every row." for s, e in t.intervals), ""]
    return "\n".join(out)
