"""What the probe makes of each event of a stream, and of how the stream ended.

Split from :mod:`tracetool.serving.probe` (which schedules and sends) so the
rules that decide "ok" are in one place:

* an event carrying ``error`` fails the request with the server's message;
* a content chunk (``delta.content``, a tool call's arguments, or ``text``) is a
  token receipt, and so is a reasoning chunk (``delta.reasoning_content`` or
  ``delta.reasoning``), counted apart; a chunk with empty or no content (the
  role chunk, the finish chunk, usage) is not a token;
* usage's ``prompt_tokens_details.cached_tokens`` (prefix-cache hits) and
  ``completion_tokens_details.reasoning_tokens`` are kept;
* usage and server timings (:mod:`tracetool.serving.server_timings`) are kept;
* at the end, a stream is **broken** — the request fails with a one-line reason —
  when it was cut before ``[DONE]`` and before a ``finish_reason``, when it
  brought no content token at all, when it ended without a ``finish_reason``, or
  when the server's ``finish_reason`` says it gave up (``abort``, ``error``).
  Fewer tokens than asked with ``finish_reason`` ``length`` or ``stop`` is a
  normal answer. A latency tool that counts an empty answer as a fast one
  reports the wrong story: llama-cpp-python's server, for one, ends a running
  stream with a role-only chunk and ``[DONE]`` when another request arrives.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tracetool.serving import server_timings
from tracetool.serving.sse import MalformedStream
from tracetool.untrusted import clip

if TYPE_CHECKING:
    from tracetool.serving.probe_types import RequestResult

#: finish_reason values with which a server says it did not finish the answer (vLLM: abort).
FAILED_FINISH = frozenset({"abort", "error", "cancelled"})


def on_event(r: RequestResult, data: str, t: int) -> None:
    """One ``data:`` payload received at client time ``t``. Raises MalformedStream."""
    if data.strip() == "[DONE]":
        r.done = True
        return
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        raise MalformedStream(f"event is not JSON: {clip(data, 80)!r}") from None
    if not isinstance(obj, dict):
        raise MalformedStream(f"event is not a JSON object: {clip(data, 80)!r}")
    if obj.get("error") is not None:
        err = obj["error"]
        msg = err.get("message") if isinstance(err, dict) else err
        r.fail(f"server error in stream: {clip(' '.join(str(msg).split()), 200)}")
        return
    r.last_chunk_ns = t
    choices = obj.get("choices")
    if choices is not None:
        if not isinstance(choices, list):
            raise MalformedStream(f"'choices' is not a list: {clip(data, 80)!r}")
        if choices:
            c0 = choices[0]
            if not isinstance(c0, dict):
                raise MalformedStream(f"choice is not an object: {clip(data, 80)!r}")
            kind = _content_kind(c0)
            if kind is not None:
                r.token_ns.append(t)
                if r.keep_text and kind == "content":
                    delta = c0.get("delta")
                    r.text.append(str((delta.get("content") if isinstance(delta, dict) else c0.get("text")) or ""))
                if kind == "reasoning":
                    r.reasoning_chunks += 1
            if c0.get("finish_reason"):
                r.finish_reason = clip(str(c0["finish_reason"]), 40)
    usage = obj.get("usage")
    if isinstance(usage, dict):
        if (n := server_timings.count(usage.get("completion_tokens"))) is not None:
            r.output_tokens = n
        if (n := server_timings.count(usage.get("prompt_tokens"))) is not None:
            r.prompt_tokens = n
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and (n := server_timings.count(details.get("cached_tokens"))) is not None:
            r.cached_prompt_tokens = n
        details = usage.get("completion_tokens_details")
        if isinstance(details, dict) and (n := server_timings.count(details.get("reasoning_tokens"))) is not None:
            r.reasoning_tokens = n
    rep = server_timings.from_event(obj)
    if rep is not None:
        # cumulative forms (llama.cpp's timings_per_token) send the running totals: the last wins
        r.server_timing = {**(r.server_timing or {}), **rep.phases}
        if rep.source not in r.timing_sources:
            r.timing_sources.append(rep.source or "")
        if rep.prompt_tokens is not None:
            r.reported_prompt_tokens = rep.prompt_tokens
        if rep.output_tokens is not None:
            r.reported_output_tokens = rep.output_tokens


def _content_kind(c0: dict[str, Any]) -> str | None:
    """``content`` or ``reasoning`` for a chunk that carries a token, None for one that does not
    (a role-only chunk, empty content, a finish or usage chunk: not tokens)."""
    delta = c0.get("delta")
    if isinstance(delta, dict):
        if _text(delta.get("content")):
            return "content"
        # vLLM and SGLang mark reasoning as reasoning_content; newer vLLM and others as reasoning
        if _text(delta.get("reasoning_content")) or _text(delta.get("reasoning")):
            return "reasoning"
        calls = delta.get("tool_calls")
        if isinstance(calls, list) and any(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                           and c["function"].get("arguments") for c in calls):
            return "content"
    return "content" if _text(c0.get("text")) else None


def _text(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def end_of_stream(r: RequestResult, junk: str | None) -> None:
    """Judge a stream the server ended (the connection closed cleanly): fail it when broken."""
    if not r.done and r.finish_reason is None:
        if junk is not None:
            raise MalformedStream(f"not an SSE line: {junk!r}, and no [DONE]")
        r.fail("stream ended before [DONE]" if r.token_ns else "stream ended before [DONE] with no content token")
    elif not r.token_ns:
        said = f"finish_reason {r.finish_reason}" if r.finish_reason else "no finish_reason"
        r.fail(f"empty stream: no content token ({said}); the server ended it without an answer")
    elif r.finish_reason is None:
        r.fail("stream ended without a finish_reason: the answer may be cut short")
    elif r.finish_reason in FAILED_FINISH:
        r.fail(f"the server ended the answer with finish_reason {r.finish_reason}")
