"""The OpenAI-compatible request checks and response shapes of ``tracetool serve``.

Plain functions over plain data (no Starlette), so the rules are testable on
their own. Every rejection is an :class:`ApiError` that becomes the JSON body
OpenAI clients understand::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": null}}

Fields OpenAI defines but this server does not act on (penalties, logit_bias,
user, ...) are accepted and ignored, as vLLM does; so are unknown fields.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant", "tool", "developer")


class ApiError(Exception):
    """A request the API refuses: HTTP status, message, error type, offending parameter, code."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (``tracetool serve`` flags)."""

    max_body_bytes: int = 1 << 20
    max_prompt_tokens: int = 4096
    max_output_tokens: int = 1024
    default_max_tokens: int = 16


@dataclass
class Parsed:
    """A checked request, ready to tokenize and schedule."""

    chat: bool
    model: str
    messages: list[dict[str, str]] = field(default_factory=list)
    prompt: str | list[int] = ""
    max_tokens: int = 16
    stream: bool = False
    include_usage: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0


def _int(body: dict[str, Any], key: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise ApiError(400, f"'{key}' must be an integer, got {type(v).__name__}", param=key)
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise ApiError(400, f"'{key}' must be {rng}, got {v}", param=key)
    return v


def _num(body: dict[str, Any], key: str, lo: float, hi: float, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ApiError(400, f"'{key}' must be a number, got {type(v).__name__}", param=key)
    if not lo <= v <= hi:
        raise ApiError(400, f"'{key}' must be between {lo:g} and {hi:g}, got {v}", param=key)
    return float(v)


def _bool(body: dict[str, Any], key: str) -> bool:
    v = body.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ApiError(400, f"'{key}' must be a boolean, got {type(v).__name__}", param=key)
    return v


def _content(msg: dict[str, Any], i: int) -> str:
    c = msg.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for part in c:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"messages[{i}].content: only text parts are supported", param="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", param="messages")


def parse_request(body: Any, *, chat: bool, served: str, limits: Limits) -> Parsed:
    """Check a decoded JSON body of ``/v1/chat/completions`` (chat) or ``/v1/completions``."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is None:
        raise ApiError(400, "'model' is required", param="model")
    if not isinstance(model, str):
        raise ApiError(400, f"'model' must be a string, got {type(model).__name__}", param="model")
    if model != served:
        raise ApiError(404, f"The model `{model}` does not exist. This server serves `{served}`.",
                       param="model", code="model_not_found")
    p = Parsed(chat=chat, model=model)
    if chat:
        msgs = body.get("messages")
        if msgs is None:
            raise ApiError(400, "'messages' is required", param="messages")
        if not isinstance(msgs, list) or not msgs:
            raise ApiError(400, "'messages' must be a non-empty list", param="messages")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict):
                raise ApiError(400, f"messages[{i}] must be an object", param="messages")
            role = m.get("role")
            if role not in ROLES:
                raise ApiError(400, f"messages[{i}].role must be one of {', '.join(ROLES)}", param="messages")
            p.messages.append({"role": role, "content": _content(m, i)})
    else:
        prompt = body.get("prompt")
        if prompt is None:
            raise ApiError(400, "'prompt' is required", param="prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            p.prompt = prompt
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                         and t >= 0 for t in prompt):
            p.prompt = list(prompt)
        elif isinstance(prompt, list) and len(prompt) > 1:
            raise ApiError(400, "batched prompts are not supported: send one prompt per request", param="prompt")
        else:
            raise ApiError(400, "'prompt' must be a string or a list of token ids", param="prompt")
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    mt = _int(body, key, 1)
    if mt is not None and mt > limits.max_output_tokens:
        raise ApiError(400, f"'{key}' is {mt}, above this server's limit of {limits.max_output_tokens} "
                       "(tracetool serve --max-output-tokens)", param=key)
    p.max_tokens = mt if mt is not None else min(limits.default_max_tokens, limits.max_output_tokens)
    n = _int(body, "n", 1)
    if n is not None and n != 1:
        raise ApiError(400, "only n=1 is supported", param="n")
    p.stream = _bool(body, "stream")
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise ApiError(400, "'stream_options' must be an object", param="stream_options")
        if not p.stream:
            raise ApiError(400, "'stream_options' is only allowed when 'stream' is true", param="stream_options")
        p.include_usage = _bool(so, "include_usage")
    p.temperature = _num(body, "temperature", 0.0, 2.0, 1.0)
    p.top_p = _num(body, "top_p", 0.0, 1.0, 1.0)
    if p.top_p == 0.0:
        raise ApiError(400, "'top_p' must be > 0", param="top_p")
    p.seed = _int(body, "seed", -(1 << 63), (1 << 63) - 1)
    stop = body.get("stop")
    if isinstance(stop, str):
        p.stop = [stop] if stop else []
    elif isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop):
        p.stop = [s for s in stop if s]
    elif stop is not None:
        raise ApiError(400, "'stop' must be a string or a list of up to 4 strings", param="stop")
    p.ignore_eos = _bool(body, "ignore_eos")
    p.min_tokens = _int(body, "min_tokens", 0) or 0
    for key in ("frequency_penalty", "presence_penalty"):
        _num(body, key, -2.0, 2.0, 0.0)
    return p


def check_lengths(prompt_tokens: int, max_tokens: int, *, context: int, limits: Limits) -> None:
    """Refuse prompts over the limit and requests that would not fit the model's context."""
    if prompt_tokens == 0:
        raise ApiError(400, "the prompt is empty after tokenization", param="prompt")
    if prompt_tokens > limits.max_prompt_tokens:
        raise ApiError(400, f"the prompt has {prompt_tokens} tokens, above this server's limit of "
                       f"{limits.max_prompt_tokens} (tracetool serve --max-prompt-tokens)",
                       param="prompt", code="context_length_exceeded")
    if prompt_tokens + max_tokens > context:
        raise ApiError(400, f"This model's maximum context length is {context} tokens. However, you "
                       f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
                       f"{max_tokens} for the completion).", param="max_tokens", code="context_length_exceeded")


# -- response shapes ------------------------------------------------------------------------
def _head(rid: str, p: Parsed, object_: str, created: int) -> dict[str, Any]:
    prefix = "chatcmpl-" if p.chat else "cmpl-"
    return {"id": prefix + rid, "object": object_, "created": created, "model": p.model}


def chunk(rid: str, p: Parsed, created: int, text: str | None, *, first: bool = False,
          finish: str | None = None) -> dict[str, Any]:
    """One streamed chunk: a token's text, or (``finish``) the closing chunk with an empty delta."""
    if p.chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**_head(rid, p, "chat.completion.chunk", created), "choices": [choice]}
    choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    return {**_head(rid, p, "text_completion", created), "choices": [choice]}


def usage_chunk(rid: str, p: Parsed, created: int, usage: dict[str, int]) -> dict[str, Any]:
    object_ = "chat.completion.chunk" if p.chat else "text_completion"
    return {**_head(rid, p, object_, created), "choices": [], "usage": usage}


def completion(rid: str, p: Parsed, created: int, text: str, finish: str, usage: dict[str, int]) -> dict[str, Any]:
    """The whole (non-streamed) response."""
    if p.chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": finish}
        return {**_head(rid, p, "chat.completion", created), "choices": [choice], "usage": usage}
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {**_head(rid, p, "text_completion", created), "choices": [choice], "usage": usage}


def models_list(served: str, context: int, created: int | None = None) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": served, "object": "model", "created": created or int(time.time()),
                                        "owned_by": "tracetool", "max_model_len": context}]}
