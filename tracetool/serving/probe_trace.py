"""The rows ``tracetool probe`` writes for one request (see :mod:`tracetool.serving.probe`).

What is measured (client spans, receipt times, outcome) and what is placed by
estimate (the server's reported durations, centred by the symmetric-delay
assumption when the server gave its total, else anchored at the first token's
receipt) are kept apart here, in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracetool.serving.probe import RequestResult


def write_request(rec: Any, r: RequestResult) -> None:
    """The rows of one probed request (see the module docstring for what is measured vs placed)."""
    rid = r.request_id
    if r.intended_ns is not None and r.start_ns:
        # waiting in the client (for a slot, or a late loop): e2e = client.queue + client.request
        rec.add_span("client.queue", r.intended_ns, max(r.start_ns, r.intended_ns), request_id=rid, clock="client")
    if r.start_ns:
        rec.add_span("client.request", r.start_ns, max(r.end_ns, r.start_ns), request_id=rid, clock="client")
    if r.connect:
        rec.add_span("client.connect", *r.connect, request_id=rid, clock="client")
    if r.tls:
        rec.add_span("client.tls", *r.tls, request_id=rid, clock="client")
    if r.retry:
        rec.add_span("client.retry", r.retry[0], max(r.retry[1], r.retry[0]), request_id=rid, clock="client")
    one_way = 0
    st = r.server_timing or {}
    server_ns = int(st["server"] * 1e6) if "server" in st else None
    client_ns = r.end_ns - r.start_ns
    if server_ns is not None and client_ns >= server_ns >= 0:
        one_way = (client_ns - server_ns) // 2
        _place_server_spans(rec, r, server_ns, one_way)
    elif server_ns is None and r.start_ns:
        _place_phases_only(rec, r)
    prompt = prompt_tokens(r)
    for i, t in enumerate(r.token_ns):
        kv = prompt + i if prompt is not None else None
        rec.token(i, kv, t - one_way, client_recv_ns=t, request_id=rid)
    outputs = r.output_tokens if r.output_tokens is not None else r.reported_output_tokens
    if outputs is None and r.reached:
        outputs = len(r.token_ns)
    rec.request_info(rid, prompt_tokens=prompt, output_tokens=outputs,
                     status="ok" if r.ok else "error", error=r.error, prompt_chars=r.prompt_chars,
                     cached_prompt_tokens=r.cached_prompt_tokens, reasoning_tokens=reasoning_tokens(r))


def prompt_tokens(r: RequestResult) -> int | None:
    """The server's count (usage, else its timings), else --tokenizer's: what the server says wins."""
    for n in (r.prompt_tokens, r.reported_prompt_tokens, r.local_prompt_tokens):
        if n is not None:
            return n
    return None


def reasoning_tokens(r: RequestResult) -> int | None:
    """The server's reasoning count where its usage gives one, else the reasoning chunks (None without any)."""
    if r.reasoning_tokens is not None:
        return r.reasoning_tokens
    return r.reasoning_chunks or None


_BEFORE_FIRST_TOKEN = ("preprocess", "tokenize", "queue", "prefill")
_AFTER_FIRST_TOKEN = ("decode", "detokenize", "postprocess")


def _place_server_spans(rec: Any, r: RequestResult, server_ns: int, one_way: int) -> None:
    """``server.request`` centred in ``client.request``; phases in serving order around the first
    token (prefill ends, decode starts, when it was sent), kept inside ``server.request``."""
    rid = r.request_id
    st = r.server_timing or {}
    s0 = r.start_ns + one_way
    s1 = s0 + server_ns
    rec.add_span("server.request", s0, s1, request_id=rid)
    d = {n: max(0, int(st[n] * 1e6)) for n in _BEFORE_FIRST_TOKEN + _AFTER_FIRST_TOKEN if n in st}
    before = [n for n in _BEFORE_FIRST_TOKEN if n in d]
    after = [n for n in _AFTER_FIRST_TOKEN if n in d]
    pre = sum(d[n] for n in before)
    post = sum(d[n] for n in after)
    anchor = r.token_ns[0] - one_way if r.token_ns else s0 + pre
    anchor = max(s0 + pre, min(anchor, s1 - post))
    t = anchor - pre
    for n in before:
        rec.add_span(n, t, t + d[n], request_id=rid)
        t += d[n]
    t = anchor
    for n in after:
        rec.add_span(n, t, t + d[n], request_id=rid)
        t += d[n]


def _place_phases_only(rec: Any, r: RequestResult) -> None:
    """Phases a server reported without its total (llama.cpp ``timings``, vLLM ``metrics``): no
    ``server.request``, so no one-way estimate either. Prefill (and queue before it) end, and decode
    starts, at the first token's receipt; the durations are the server's, the placement assumes
    no delay on the way back (the network is not measured for such a request)."""
    rid = r.request_id
    st = r.server_timing or {}
    d = {n: max(0, int(st[n] * 1e6)) for n in _BEFORE_FIRST_TOKEN + _AFTER_FIRST_TOKEN if n in st}
    if not d:
        return
    pre = sum(d[n] for n in _BEFORE_FIRST_TOKEN if n in d)
    anchor = max(r.token_ns[0] if r.token_ns else r.start_ns + pre, r.start_ns + pre)
    t = anchor - pre
    for n in _BEFORE_FIRST_TOKEN:
        if n in d:
            rec.add_span(n, t, t + d[n], request_id=rid)
            t += d[n]
    t = anchor
    for n in _AFTER_FIRST_TOKEN:
        if n in d:
            rec.add_span(n, t, t + d[n], request_id=rid)
            t += d[n]
