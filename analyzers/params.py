"""What the SQL modules are parameterised with: thresholds, roofline inputs, claims.

Everything here is resolved in Python before any SQL runs, and handed to DuckDB
as one-row or small tables (``_thresholds``, ``_hardware``, ``_claims``):

* :class:`Thresholds`: the numbers behind claim verdicts and findings; every one
  can be changed (``tracetool analyze --threshold NAME=VALUE``).
* :func:`roofline_inputs`: model and hardware for the roofline, from
  ``meta.json`` (docs/trace-format.md) or from presets (``--model``, ``--gpu``),
  which override meta.json. A CPU trace, or one whose hardware is unknown,
  gets no roofline and says why (``note``).
* :func:`parse_claim`: a user's story (``network-rtt``, "decode is
  compute-bound", ...) mapped to a claim key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Any

from tracetool.errors import UsageError
from tracetool.meta import model_block
from tracetool.presets import dtype_bytes, gpu_preset, match_gpu_name, model_preset
from tracetool.schema import COMPONENTS


@dataclass(frozen=True)
class Thresholds:
    """Thresholds of verdicts and findings (docs/findings.md says which uses which)."""

    #: A claim is ``supported`` when its component is the bottleneck or holds at least this share of e2e.
    supported_share: float = 1 / 3
    #: A claim is a ``misdiagnosis`` when its component holds less than this share and is not the bottleneck.
    misdiagnosis_share: float = 0.10
    #: Median output tokens at or below this: outputs are "tiny" and TTFT / fixed costs dominate.
    short_output_tokens: float = 5
    #: Mean network time per request at or above this (ms): a slow, congested or cross-region link.
    slow_network_ms: float = 100
    #: Tokenize cost per prompt token at or above this (microseconds): pathological tokenizer (fast ones ~1 us).
    tokenizer_us_per_token: float = 50
    #: The per-token rate counts only prompts of at least this many tokens: over fewer, a fast
    #: tokenizer's fixed cost per call (0.1-1 ms) divided by the count looks like a slow tokenizer.
    tokenizer_min_prompt_tokens: float = 100
    #: Queue share of TTFT at or above this: overload (queueing dominates TTFT).
    queue_ttft_share: float = 0.5
    #: Host time between steps as a share of ITL at or above this: host overhead finding.
    host_overhead_share: float = 0.2
    #: Bandwidth efficiency below this: low efficiency finding (0.55-0.85 is typical at batch 1).
    low_bandwidth_efficiency: float = 0.4
    #: Bandwidth efficiency at or above this: decode is on the memory side of the roofline.
    memory_bound_efficiency: float = 0.3
    #: Compute time / memory time of a decode step at or above this: compute-bound decode.
    compute_bound_ratio: float = 1.0
    #: Minimum r2 of the decode fit for the KV-growth finding.
    kv_growth_r2: float = 0.3
    #: Minimum ITL growth over the observed kv_len range, percent of the base, for the KV-growth finding.
    kv_growth_pct: float = 5
    #: Aggregate tok/s at or above this many times the per-request rate: throughput conflation finding.
    conflation_ratio: float = 2
    #: Mean decode time per request at or below this (seconds): decode really is "sub-second".
    sub_second_decode_s: float = 1.0
    #: Models with fewer parameters than this are "small": KV cache tiny, host overhead comparable.
    small_model_params: float = 3e9
    #: Mean GPU utilisation during decode windows below this (percent): the GPU waits on the host.
    gpu_busy_pct: float = 50
    #: Unattributed server time ("other") at or above this share: a phase is missing from the trace.
    other_share: float = 0.2
    #: Steps that also prefill taking at least this many times a decode-only step: prefill stalls.
    prefill_stall_ratio: float = 2
    #: Decode time lost to co-scheduled prefill work (iterations a running request waited through, plus
    #: the stretch of its own steps that also prefilled) at or above this share of ITL: prefill interference.
    prefill_interference_share: float = 0.1
    #: A request that misses at least this many decode iterations in a row while the engine keeps
    #: stepping was not running: preempted (or evicted and recomputed), not waiting on prefill.
    preemption_min_steps: float = 3
    #: Time preempted requests spent with no step, at or above this share of decode time: preemption finding.
    preemption_share: float = 0.02
    #: Share of busy CPU samples in one category at or above this: that category is hot.
    cpu_category_share: float = 0.2
    #: Round trips that bound a streamed request's network time from above when only the client's TCP
    #: handshakes measure the link (a client-only trace): network <= this many RTTs.
    network_bound_round_trips: float = 10
    #: A load client that sends below this share of its offered rate is the limit (client-bound).
    client_rate_ratio: float = 0.9
    #: Time waiting in the load client (client_queue) at or above this share of e2e: client-bound.
    client_queue_share: float = 0.10
    # -- the tail (module tail: the requests above p95 and p99 against the p40-p60 band) --
    #: Fewest requests above p99 (else above p95) to say what the tail has in common: below it no cause is named.
    tail_min_requests: float = 5
    #: A component (or decode part) holding at least this share of the gap between the tail's mean and the
    #: typical requests' mean is where the tail's extra time went.
    tail_component_share: float = 0.5
    #: Cliff's delta of a feature (tail against typical requests, -1..1) at least this far from 0: the feature
    #: separates the tail (0.474 is Romano et al.'s "large").
    tail_effect_size: float = 0.474
    #: ... and its Mann-Whitney p-value, Bonferroni-adjusted over the features compared, below this.
    tail_significance: float = 0.01
    #: A numeric feature's tail mean at least this many times the typical mean (or a binary feature's share in
    #: the tail at least this many times the typical share) for the findings that name a size (long prompts,
    #: long outputs).
    tail_ratio: float = 2
    #: ITL gaps the ITL tail keeps at most: beyond, a deterministic 1-in-N sample of the gaps (N the smallest
    #: that keeps at most this many decode tokens).
    tail_itl_sample: float = 50_000
    # -- engine metrics (module engine: a server's scraped /metrics) --
    #: Requests waiting at one scrape at or above this: the engine queued requests.
    engine_waiting_requests: float = 1
    #: KV-cache usage (fraction 0-1) at or above this at one scrape: the cache is full.
    kv_cache_full: float = 0.95
    #: Prefix-cache hit rate (fraction 0-1) below this: the cache is missed.
    prefix_cache_hit_rate_low: float = 0.2
    #: Mean prompt length (tokens) at or above this for the prefix-cache finding: prefill worth caching.
    prefix_cache_prompt_tokens: float = 256

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def with_overrides(self, items: dict[str, float]) -> Thresholds:
        """A copy with some thresholds changed; unknown names are a usage error."""
        unknown = sorted(set(items) - set(self.names()))
        if unknown:
            raise UsageError(f"unknown threshold {unknown[0]!r} (known: {', '.join(self.names())})")
        return replace(self, **{k: float(v) for k, v in items.items()})

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def parse_threshold(text: str) -> tuple[str, float]:
    """``NAME=VALUE`` (``supported_share=0.4``; dashes accepted) -> (name, value)."""
    name, sep, value = text.partition("=")
    if not sep:
        raise UsageError(f"--threshold {text!r}: expected NAME=VALUE")
    try:
        return name.strip().replace("-", "_"), float(value)
    except ValueError:
        raise UsageError(f"--threshold {text!r}: {value!r} is not a number") from None


# -- roofline inputs ------------------------------------------------------------------------

@dataclass(frozen=True)
class RooflineInputs:
    """Model and hardware numbers of one trace. ``kind`` is 'gpu', 'cpu' or 'unknown'."""

    kind: str
    model: str | None = None
    gpu: str | None = None
    gpu_count: int = 1
    #: Bytes of weights read per decode step, all GPUs together (input embedding left out).
    weight_bytes: float | None = None
    kv_bytes_per_token: float | None = None
    #: Per GPU.
    mem_bw_bytes_per_s: float | None = None
    #: Per GPU, dense, at the weights' dtype.
    peak_flops: float | None = None
    params: float | None = None
    active_params: float | None = None
    source: str = "meta.json"
    #: Why the roofline cannot be computed, or what was assumed.
    note: str | None = None
    #: MoE: routed experts per MoE layer (E) and experts each token uses (k); null for dense models.
    experts: float | None = None
    experts_per_token: float | None = None
    #: MoE: bytes of all routed experts' weights, all layers. ``weight_bytes`` holds k/E of them (one
    #: token's read); a batch of B sequences touches 1 - (1 - k/E)^B of them (docs/domain.md).
    expert_bytes: float | None = None
    #: What of meta.json's model block was not used (tracetool.meta.model_block): one line for the
    #: analysis's warnings; None when all of it was.
    warning: str | None = None

    @property
    def complete(self) -> bool:
        return (self.kind == "gpu" and self.weight_bytes is not None and self.kv_bytes_per_token is not None
                and bool(self.mem_bw_bytes_per_s))


_CPU_NAMES = {"cpu", "none", "host"}


def roofline_inputs(meta: dict[str, Any], *, model: str | None = None, gpu: str | None = None,
                    gpus: int | None = None, weight_dtype: str | None = None,
                    kv_dtype: str | None = None) -> RooflineInputs:
    """Resolve the roofline's inputs for a trace; presets (``model``, ``gpu``) override meta.json."""
    notes: list[str] = []
    m = meta.get("model") if isinstance(meta.get("model"), dict) else {}
    h = meta.get("hardware") if isinstance(meta.get("hardware"), dict) else {}
    assert isinstance(m, dict) and isinstance(h, dict)
    unused: str | None = None
    if not model:  # Hugging Face names read as tracetool's; a preset replaces the block whole
        m, unused = model_block(m)
    sources: list[str] = []
    # model
    name: str | None
    params: float | None
    active: float | None
    weight: float | None
    kvb: float | None
    if model:
        p = model_preset(model)
        wd, kd = weight_dtype or "bf16", kv_dtype or "bf16"
        name, weight, kvb = p.name, p.weight_bytes_read(wd), p.kv_bytes_per_token(kd)
        params, active = p.params, p.active_params
        experts: float | None = float(p.experts) if p.experts else None
        per_token: float | None = float(p.experts_per_token) if p.experts_per_token else None
        wb = dtype_bytes(wd)
        sources.append("--model")
    else:
        name = m.get("name")
        params, active = _num(m.get("params")), _num(m.get("active_params"))
        weight, kvb = _meta_weight_bytes(m, weight_dtype, notes), _meta_kv_bytes(m, kv_dtype, notes)
        experts, per_token = _num(m.get("experts")), _num(m.get("experts_per_token"))
        wb = dtype_bytes(weight_dtype) if weight_dtype else (_num(m.get("weight_bytes_per_param")) or 2.0)
        if m:
            sources.append("meta.json")
    # hardware
    kind = "unknown"
    gname: str | None = None
    bw = flops = None
    count = int(gpus or _num(h.get("gpu_count")) or 1)
    wdtype = weight_dtype or _dtype_name(_num(m.get("weight_bytes_per_param")))
    if gpu:
        g = gpu_preset(gpu)
        kind, gname, bw, flops = "gpu", g.name, g.mem_bw_bytes_per_s, g.peak_flops(wdtype)
        sources.append("--gpu")
    elif h:
        gname = h.get("gpu") if isinstance(h.get("gpu"), str) else None
        is_cpu = (gname or "").strip().lower() in _CPU_NAMES or str(h.get("device", "")).lower() == "cpu" \
            or str(h.get("kind", "")).lower() == "cpu" or (gname is None and "cpu" in h)
        if is_cpu:
            kind = "cpu"
        else:
            preset = match_gpu_name(gname) if gname else None
            bw = _num(h.get("mem_bw_bytes_per_s")) or (preset.mem_bw_bytes_per_s if preset else None)
            flops = _num(h.get("peak_flops")) or (preset.peak_flops(wdtype) if preset else None)
            kind = "gpu" if bw else "unknown"
            if not bw:
                notes.append(f"hardware {gname or '(unnamed)'} has no mem_bw_bytes_per_s and matches no preset")
        if "meta.json" not in sources:
            sources.append("meta.json")
    if kind == "cpu":
        notes.append("CPU run: no GPU memory-bandwidth roofline; on CPU, compute and Python host overhead "
                     "per step are comparable to memory traffic")
    elif kind == "unknown" and not h:
        notes.append("hardware unknown: meta.json has no hardware block (pass --gpu)")
    if weight is None or kvb is None:
        notes.append("model unknown: meta.json has no usable model block (pass --model)" if not m and not model
                     else "model block lacks params or layers/kv_heads/head_dim")
    expert_bytes = _expert_bytes(params, active, experts, per_token, wb, notes)
    if expert_bytes is None:
        experts = per_token = None
    return RooflineInputs(kind=kind, model=name, gpu=gname, gpu_count=count, weight_bytes=weight,
                          kv_bytes_per_token=kvb, mem_bw_bytes_per_s=bw, peak_flops=flops, params=params,
                          active_params=active, source=" + ".join(sources) or "none",
                          note="; ".join(notes) or None, experts=experts, experts_per_token=per_token,
                          expert_bytes=expert_bytes, warning=unused)


def _expert_bytes(params: float | None, active: float | None, experts: float | None, per_token: float | None,
                  bytes_per_param: float, notes: list[str]) -> float | None:
    """Bytes of all routed experts: params = dense + E x e and active = dense + k x e give e."""
    if not experts or experts <= 1:
        return None
    if not per_token or per_token >= experts or not params or not active or active >= params:
        notes.append("MoE model block needs params > active_params and 0 < experts_per_token < experts: "
                     "active parameters read at every batch size")
        return None
    return (params - active) / (experts - per_token) * experts * bytes_per_param


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _dtype_name(b: float | None) -> str:
    return "fp8" if b is not None and b <= 1 else "bf16"


def _meta_weight_bytes(m: dict[str, Any], weight_dtype: str | None, notes: list[str]) -> float | None:
    p = _num(m.get("active_params")) or _num(m.get("params"))
    if p is None:
        return None
    vocab, hidden = _num(m.get("vocab")), _num(m.get("hidden"))
    if vocab and hidden and not m.get("tied_embeddings"):
        p -= vocab * hidden  # one row of the input embedding is read, not the table
    b = dtype_bytes(weight_dtype) if weight_dtype else _num(m.get("weight_bytes_per_param"))
    if b is None:
        b = 2.0
        notes.append("weight_bytes_per_param not in meta.json: 2 (bf16) assumed")
    return p * b


def _meta_kv_bytes(m: dict[str, Any], kv_dtype: str | None, notes: list[str]) -> float | None:
    direct = _num(m.get("kv_bytes_per_token"))
    if direct is not None:
        return direct
    layers, rank = _num(m.get("layers")), _num(m.get("kv_lora_rank"))
    if layers and rank:  # MLA: one compressed latent plus the rope key per layer, no heads
        mb = dtype_bytes(kv_dtype) if kv_dtype else (_num(m.get("kv_bytes_per_elem")) or 2.0)
        return layers * (rank + (_num(m.get("qk_rope_head_dim")) or 0)) * mb
    layers, kv_heads, head_dim = (_num(m.get(k)) for k in ("layers", "kv_heads", "head_dim"))
    if not (layers and kv_heads and head_dim):
        return None
    b = dtype_bytes(kv_dtype) if kv_dtype else _num(m.get("kv_bytes_per_elem"))
    if b is None:
        b = 2.0
        notes.append("kv_bytes_per_elem not in meta.json: 2 (bf16) assumed")
    return 2 * layers * kv_heads * head_dim * b


# -- claims ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ClaimSpec:
    """A story to test: the user's words and the claim key they map to.

    A claim about the tail (``p99-ttft=network``) has a ``scope``: the metric (ttft, e2e, tpot, itl)
    and the tail (p95, p99) it is about, and ``tail_component`` is what it is judged on there: the
    component (ttft, e2e) or decode part (tpot, itl) that holds the tail's extra time (module tail).
    """

    text: str
    key: str
    scope_metric: str | None = None
    scope_level: str | None = None
    tail_component: str | None = None

    @property
    def scope(self) -> str | None:
        return f"{self.scope_level}-{self.scope_metric}" if self.scope_metric else None


#: key -> (component the verdict is about, the story in words).
CLAIMS: dict[str, tuple[str, str]] = {
    "network": ("network", "It's the network RTT."),
    "frontend": ("frontend", "It's the server's frontend (HTTP handling, chat template, streaming)."),
    "queue": ("queue", "It's queueing: the server is overloaded."),
    "tokenize": ("tokenize", "It's tokenizer overhead."),
    "preprocess": ("preprocess", "It's pre-processing (retrieval, templating, guardrails)."),
    "prefill": ("prefill", "It's prefill: the prompt is too long."),
    "decode": ("decode", "It's decode: generating the tokens."),
    "detokenize": ("detokenize", "It's detokenization."),
    "postprocess": ("postprocess", "It's post-processing (reranking, filters, serialisation)."),
    "other": ("other", "It's something outside the named phases."),
    "compute-bound": ("decode", "Decode is compute-bound; more FLOPs will help."),
    "throughput": ("decode", "The server does thousands of tok/s, so decode must be sub-second."),
}

CLAIM_ALIASES: dict[str, str] = {
    "network-rtt": "network", "rtt": "network", "net": "network", "network-latency": "network",
    "server-frontend": "frontend", "api-server": "frontend", "http-server": "frontend",
    "queueing": "queue", "queuing": "queue", "overload": "queue",
    "tokenizer": "tokenize", "tokenization": "tokenize", "tokenizer-overhead": "tokenize",
    "preprocessing": "preprocess", "pre-processing": "preprocess", "retrieval": "preprocess",
    "prompt": "prefill", "long-prompt": "prefill",
    "detokenizer": "detokenize", "detokenization": "detokenize",
    "postprocessing": "postprocess", "post-processing": "postprocess", "guardrails": "postprocess",
    "compute": "compute-bound", "decode-is-compute-bound": "compute-bound", "more-flops": "compute-bound",
    "tok-s": "throughput", "aggregate-throughput": "throughput", "thousands-of-tok-s": "throughput",
}

# Free-text fallbacks, most specific first.
_KEYWORDS = (("compute", "compute-bound"), ("flop", "compute-bound"), ("thousand", "throughput"),
             ("throughput", "throughput"), ("tok-s", "throughput"), ("detoken", "detokenize"),
             ("tokeni", "tokenize"), ("frontend", "frontend"), ("network", "network"), ("rtt", "network"),
             ("queu", "queue"),
             ("overload", "queue"), ("prefill", "prefill"), ("prompt", "prefill"),
             ("preprocess", "preprocess"), ("pre-process", "preprocess"), ("retrieval", "preprocess"),
             ("postprocess", "postprocess"), ("post-process", "postprocess"), ("guardrail", "postprocess"),
             ("rerank", "postprocess"), ("decode", "decode"))


#: Tail claims: the metrics and tails they may name (not TPOT, split per request into preempted time only), and
#: for ITL (judged on the decode parts of the step accounting) the part each claim key stands for.
TAIL_METRICS = ("ttft", "e2e", "itl")
TAIL_LEVELS = ("p95", "p99")
TAIL_DECODE_PARTS = {"prefill": "prefill", "decode": "own_step", "network": "client_side"}
_TAIL_RE = re.compile(r"^(p95|p99)-(ttft|e2e|tpot|itl)(?:-(.*))?$")


def parse_claim(text: str) -> ClaimSpec:
    """Map a claim name, alias or phrase ("decode is compute-bound") to a :class:`ClaimSpec`; a claim
    about the tail starts with its percentile and metric (``p99-ttft=network``, "p99 TTFT is queueing")."""
    norm = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    m = _TAIL_RE.match(norm)
    if m:
        return _tail_claim(text, m.group(1), m.group(2), m.group(3) or "")
    return ClaimSpec(text, _claim_key(text, norm))


def _tail_claim(text: str, level: str, metric: str, rest: str) -> ClaimSpec:
    if not rest:
        raise UsageError(f"claim {text!r}: say what the {level} {metric} is (e.g. {level}-{metric}=network)")
    key = _claim_key(text, rest)
    component = CLAIMS[key][0]
    if key in ("compute-bound", "throughput"):
        raise UsageError(f"claim {text!r}: {key} is about decode speed, not a tail; claims about a tail name a "
                         "component (network, queue, prefill, ...)")
    if metric == "tpot":
        raise UsageError(f"claim {text!r}: the TPOT tail is split per request into its preempted time only; "
                         f"claim about the ITL tail ({level}-itl={key}), whose gaps are split by the engine's state")
    if metric == "itl":
        part = TAIL_DECODE_PARTS.get(key)
        if part is None:
            raise UsageError(f"claim {text!r}: the ITL tail is judged on the parts of decode; claims about it "
                             f"are {', '.join(TAIL_DECODE_PARTS)}")
        component = part
    elif metric == "ttft" and COMPONENTS.index(component) > COMPONENTS.index("prefill"):
        raise UsageError(f"claim {text!r}: TTFT ends at the first token, before {component}; claim it about the "
                         f"e2e tail ({level}-e2e={key})")
    return ClaimSpec(text, key, scope_metric=metric, scope_level=level, tail_component=component)


def tail_claims() -> list[str]:
    """Every claim about a tail the analyzer can judge (``p99-ttft=network``...): per tail, metric and
    component claim that fits it (the TUI asks for all of them up front, as for the mean claims)."""
    out = []
    for level in TAIL_LEVELS:
        for metric in TAIL_METRICS:
            for key, (component, _) in CLAIMS.items():
                after_ttft = COMPONENTS.index(component) > COMPONENTS.index("prefill")
                fits = {"ttft": not after_ttft, "e2e": True, "itl": key in TAIL_DECODE_PARTS}[metric]
                if fits and key not in ("compute-bound", "throughput"):
                    out.append(f"{level}-{metric}={key}")
    return out


def _claim_key(text: str, norm: str) -> str:
    key = norm if norm in CLAIMS else CLAIM_ALIASES.get(norm)
    if key is None:
        key = next((k for word, k in _KEYWORDS if word in norm), None)
    if key is None:
        known = ", ".join([*CLAIMS, *CLAIM_ALIASES])
        raise UsageError(f"unknown claim {text!r} (known: {known}; about a tail: p99-ttft=network, "
                         "p95-e2e=queue, p99-itl=prefill)")
    return key
