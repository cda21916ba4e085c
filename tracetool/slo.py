"""Service-level objectives, goodput and attainment (``--slo ttft_ms=500,tpot_ms=50,e2e_ms=...``).

A request **meets** the SLOs when it succeeded and each of its measured
metrics is at or under its target (a metric it has none of, such as TPOT of a
one-token answer, does not hold it back, as vLLM's goodput counts it).
**Attainment** is the share of requests that meet them, failed requests
included in the count; **goodput** is the requests that meet them per second
of the run (vLLM ``bench serve``'s definition). A run **meets** the SLOs when
attainment is at least ``attainment`` (default 0.99, settable in the same
string: ``--slo ttft_ms=500,attainment=0.9``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tracetool.errors import UsageError

#: The metrics an SLO can bound, per request, milliseconds.
KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
DEFAULT_ATTAINMENT = 0.99


@dataclass(frozen=True)
class SLO:
    targets: dict[str, float]
    attainment: float = DEFAULT_ATTAINMENT

    def meets(self, row: Mapping[str, Any]) -> bool:
        """Whether one request (a mapping with ``ok`` and the metrics in ms) meets every target."""
        if row.get("ok") is False:
            return False
        for k, limit in self.targets.items():
            v = row.get(k)
            if v is not None and v > limit:
                return False
        return True

    def evaluate(self, rows: Iterable[Mapping[str, Any]], wall_s: float | None) -> dict[str, Any]:
        """The documented ``slo`` object: targets, requests meeting them, attainment, goodput, met."""
        rows = list(rows)
        good = sum(1 for r in rows if self.meets(r))
        attainment = good / len(rows) if rows else None
        return {"targets": dict(self.targets), "attainment_target": self.attainment, "requests": len(rows),
                "met_requests": good, "attainment": attainment,
                "goodput_rps": good / wall_s if wall_s else None,
                "met": attainment is not None and attainment >= self.attainment}


def parse_slo(text: str | None) -> SLO | None:
    """``ttft_ms=500,tpot_ms=50`` -> SLO; an unknown key or a bad value is a usage error (exit 2)."""
    if not text:
        return None
    targets: dict[str, float] = {}
    attainment = DEFAULT_ATTAINMENT
    for part in str(text).split(","):
        key, sep, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise UsageError(f"--slo {text!r}: expected KEY=VALUE pairs, e.g. ttft_ms=500,tpot_ms=50")
        if key not in (*KEYS, "attainment"):
            raise UsageError(f"--slo: unknown key {key!r} (known: {', '.join(KEYS)}, attainment)")
        try:
            v = float(value)
        except ValueError:
            raise UsageError(f"--slo {key}={value!r}: not a number") from None
        if key == "attainment":
            if not 0 < v <= 1:
                raise UsageError(f"--slo attainment={value}: must be in (0, 1]")
            attainment = v
        elif not v > 0:
            raise UsageError(f"--slo {key}={value}: must be > 0 ms")
        else:
            targets[key] = v
    if not targets:
        raise UsageError(f"--slo {text!r}: no target (keys: {', '.join(KEYS)})")
    return SLO(targets, attainment)
