"""Small HTTP helpers of the probe: bounded body reads and one-line error messages."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tracetool.untrusted import clip

if TYPE_CHECKING:
    from tracetool.serving.probe_types import RequestResult


async def _read_capped(resp: Any, limit: int) -> bytes:
    """At most ``limit`` bytes of a response body (an error page or model list, never endless)."""
    parts: list[bytes] = []
    n = 0
    async for part in resp.aiter_bytes():
        parts.append(part)
        n += len(part)
        if n >= limit:
            break
    return b"".join(parts)[:limit]


def _rejected_field(r: RequestResult, optional: dict[str, Any]) -> str | None:
    """The optional field a server's HTTP 400/422 names, when the request got nothing else."""
    if r.http_status not in (400, 422) or not r.error or r.token_ns:
        return None
    return next((k for k in optional if k in r.error), None)


def _error_message(raw: bytes) -> str:
    try:
        obj = json.loads(raw)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        msg = err.get("message") if isinstance(err, dict) else err
        return clip(str(msg), 200) if msg else clip(raw.decode("utf-8", "replace"), 200)
    except (ValueError, RecursionError):
        return clip(" ".join(raw.decode("utf-8", "replace").split()), 200) or "(empty body)"


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
