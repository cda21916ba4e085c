"""GenAI-Perf ``profile_export.json`` (written by Perf Analyzer, read by GenAI-Perf).

The shape (Perf Analyzer ``profile_data_exporter.cc``; GenAI-Perf
``profile_data_parser.py`` and its tests): one object with ``experiments``
(one per load level: ``experiment.mode`` ``concurrency``/``request_rate`` and
``experiment.value``), each holding ``requests``; optional ``version``,
``service_kind`` (``openai``, ``triton``, ...) and ``endpoint``. A request has

* ``timestamp``: when it was sent, nanoseconds of ``std::chrono::system_clock``
  (Unix epoch on Linux);
* ``response_timestamps``: one per received response, same clock;
* ``response_outputs``: one per response: ``{"response": "data: {...}\\n\\n"}``
  (raw SSE text for OpenAI endpoints) or ``{"text_output": "..."}`` (Triton);
* ``request_inputs``: ``{"payload": "<request JSON>"}`` for OpenAI, or the
  Triton inputs (``text_input``, ``max_tokens``, ...).

GenAI-Perf drops responses without content (role-only chunks, empty deltas,
usage chunks, ``[DONE]``) before its metrics: TTFT is the first content
response minus ``timestamp`` and request latency ends at the last content
response. This importer follows the same rule, so its TTFT equals GenAI-Perf's.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from tracetool.errors import BadInput
from tracetool.importers.common import (
    CLIENT_ONLY_NOTE,
    EMIT_NS_NOTE,
    BadValue,
    ImportedRequest,
    ImportResult,
    Skips,
    chunk_note,
    count,
    read_json,
    timestamp_ns,
    type_name,
)
from tracetool.untrusted import clip

WHAT = "a GenAI-Perf profile_export.json"


def parse(path: Path) -> ImportResult:
    data = read_json(path, WHAT)
    if not isinstance(data, dict):
        raise BadInput(f"{path}: top level is a {type_name(data)}; {WHAT} holds one object")
    experiments = data.get("experiments")
    if experiments is None:
        raise BadInput(f"{path}: no \"experiments\": not {WHAT} "
                       f"(found keys: {', '.join(sorted(data)[:8]) or 'none'})")
    if not isinstance(experiments, list):
        raise BadInput(f'{path}: "experiments" is a {type_name(experiments)}, expected a list')
    if not experiments:
        raise BadInput(f"{path}: no experiments (the list is empty)")
    kind = data.get("service_kind") if isinstance(data.get("service_kind"), str) else None

    skips = Skips()
    requests: list[ImportedRequest] = []
    unparsed = 0
    usage_seen = False
    labels = []
    total = 0
    for e, exp in enumerate(experiments):
        if not isinstance(exp, dict) or not isinstance(exp.get("requests"), list):
            raise BadInput(f"{path}: experiments[{e}] has no \"requests\" list")
        label = _label(exp, e, len(experiments))
        labels.append(label or "default")
        for i, raw in enumerate(exp["requests"]):
            total += 1
            rid = f"{label}-{i}" if label else str(i)
            try:
                r, bad_sse = _request(rid, raw, kind)
            except BadValue as err:
                skips.add(rid, str(err))
                continue
            unparsed += bad_sse
            usage_seen |= r.status == "ok" and not r.one_token_per_chunk
            requests.append(r)
    if not requests:
        if total == 0:
            raise BadInput(f"{path}: no requests (every experiment's list is empty)")
        raise BadInput(f"{path}: no usable request: {skips.first()}")

    notes = [f"imported from {WHAT.removeprefix('a ')} ({path.name}): {len(requests)} of {total} "
             f"requests in {len(experiments)} experiment(s) ({', '.join(labels)})",
             CLIENT_ONLY_NOTE, EMIT_NS_NOTE,
             "times are Perf Analyzer's system_clock nanoseconds (Unix epoch of the client host); "
             "TTFT and the end of client.request use content responses only, as GenAI-Perf does",
             "prompt_tokens is known only where the stream reported usage (GenAI-Perf counts "
             "tokens with a tokenizer, which an offline import does not have); prompt_chars is the "
             "prompt's length in characters"]
    if not usage_seen:
        notes.append("output_tokens counts streamed content responses (no usage in the stream); "
                     "a response can carry several tokens")
    if len(experiments) > 1:
        notes.append("experiments are merged into one trace; request ids start with the experiment "
                     "(mode and value)")
    if unparsed:
        notes.append(f"{unparsed} response(s) were not parseable SSE JSON (split chunks); "
                     "they are counted as non-content, as GenAI-Perf merges them into their neighbour")
    notes += chunk_note(requests)
    notes += skips.notes()
    details: dict[str, Any] = {k: data[k] for k in ("version", "service_kind", "endpoint")
                               if isinstance(data.get(k), (str, int, float))}
    details["experiments"] = labels
    return ImportResult(tool="genai-perf", source=path, requests=requests, notes=notes,
                        timeline="epoch", details=details, skipped=skips.total)


def _label(exp: dict[str, Any], e: int, n: int) -> str:
    if n == 1:
        return ""
    spec = exp.get("experiment")
    if isinstance(spec, dict) and "mode" in spec:
        return f"{spec.get('mode')}{spec.get('value', '')}"
    return f"exp{e}"


def _request(rid: str, raw: Any, kind: str | None) -> tuple[ImportedRequest, int]:
    if not isinstance(raw, dict):
        raise BadValue(f"request is a {type_name(raw)}, not an object")
    if "timestamp" not in raw:
        raise BadValue("no timestamp")
    start = timestamp_ns(raw["timestamp"], "timestamp")
    times = raw.get("response_timestamps")
    if not isinstance(times, list):
        raise BadValue(f"response_timestamps is a {type_name(times)}, not a list")
    outputs = raw.get("response_outputs")
    if outputs is not None and not isinstance(outputs, list):
        raise BadValue(f"response_outputs is a {type_name(outputs)}, not a list")
    if outputs is not None and len(outputs) != len(times):
        raise BadValue(f"{len(times)} response_timestamps but {len(outputs)} response_outputs")
    stamps = [timestamp_ns(t, "response timestamp") for t in times]
    r = ImportedRequest(request_id=rid)
    r.prompt_chars = _prompt_chars(raw.get("request_inputs"))

    content: list[int] = []
    bad_sse = 0
    usage: dict[str, Any] = {}
    error = None
    for k, t in enumerate(stamps):
        out = outputs[k] if outputs is not None else None
        has_text, unparsed, use, err = _response(out, kind)
        bad_sse += unparsed
        usage.update(use)
        error = error or err
        if has_text:
            content.append(t)
    if error:
        r.status, r.error = "error", error
        return r, bad_sse
    if not content:
        r.status, r.error = "error", "no response with content (GenAI-Perf skips such requests)"
        r.output_tokens = 0
        return r, bad_sse
    if content[0] < start:
        raise BadValue("first response is before the request timestamp")
    if any(b < a for a, b in itertools.pairwise(content)):
        raise BadValue("response timestamps go backwards")
    r.start_ns = start
    r.token_ns = content
    r.end_ns = content[-1]
    if "completion_tokens" in usage:
        r.output_tokens = count(usage["completion_tokens"], "usage.completion_tokens")
    else:
        r.output_tokens = len(content)
        r.one_token_per_chunk = True  # by construction; chunk_note leaves it so
    if "prompt_tokens" in usage:
        r.prompt_tokens = count(usage["prompt_tokens"], "usage.prompt_tokens")
    return r, bad_sse


def _response(out: Any, kind: str | None) -> tuple[bool, int, dict[str, Any], str | None]:
    """(has content, unparseable pieces, usage fields, error) of one response."""
    if out is None:
        return True, 0, {}, None  # no outputs recorded: every response counts, as timed
    if not isinstance(out, dict):
        raise BadValue(f"response output is a {type_name(out)}, not an object")
    if "text_output" in out:  # Triton
        text = out["text_output"]
        return (bool(text) if isinstance(text, str) else text is not None), 0, {}, None
    body = out.get("response")
    if not isinstance(body, str):
        return True, 0, {}, None  # an output shape we do not know: count it as the tool timed it
    has_text, unparsed, usage, error = False, 0, {}, None
    for piece in body.strip().split("\n\n"):
        lines = [ln.strip() for ln in piece.strip().splitlines() if ln.strip()]
        if not lines:
            continue
        if any(ln.startswith("event:") and "error" in ln for ln in lines):
            error = f"SSE error event: {clip(piece.strip(), 200)}"
            continue
        payload = "".join(ln[5:].strip() if ln.startswith("data:") else ln for ln in lines
                          if not ln.startswith((":", "event:", "id:", "retry:")))
        if not payload or payload == "[DONE]":
            continue
        try:
            data = json.loads(payload)
        except (json.JSONDecodeError, RecursionError):
            unparsed += 1
            continue
        if not isinstance(data, dict):
            continue
        if data.get("error"):
            error = f"error response: {clip(json.dumps(data['error']), 200)}"
        if isinstance(data.get("usage"), dict):
            usage.update({k: v for k, v in data["usage"].items() if k in ("completion_tokens", "prompt_tokens")
                          and v is not None})
        has_text |= bool(_text(data))
    return has_text, unparsed, usage, error


def _text(data: dict[str, Any]) -> str:
    if isinstance(data.get("text_output"), str):  # Triton generate endpoint
        return str(data["text_output"])
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    c = choices[0]
    for part in (c.get("delta"), c.get("message")):
        if isinstance(part, dict):
            for key in ("content", "reasoning_content"):
                if isinstance(part.get(key), str) and part[key]:
                    return str(part[key])
    return c["text"] if isinstance(c.get("text"), str) else ""


def _prompt_chars(inputs: Any) -> int | None:
    if not isinstance(inputs, dict):
        return None
    if isinstance(inputs.get("text_input"), str):
        return len(inputs["text_input"])
    payload = inputs.get("payload")
    if not isinstance(payload, str):
        return None
    try:
        body = json.loads(payload)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("prompt"), str):
        return len(body["prompt"])
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    n = 0
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            n += len(content)
        elif isinstance(content, list):
            n += sum(len(c["text"]) for c in content if isinstance(c, dict) and isinstance(c.get("text"), str))
    return n
