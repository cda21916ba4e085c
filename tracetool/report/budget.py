"""Budget files: the TOML a CI job gates on (docs/ci-reports.md has the reference).

A budget file is flat on purpose, one line per promise::

    p95_ttft_ms = 500      # absolute: p95 TTFT at most 500 ms
    p50_itl_pct = 10       # relative: p50 ITL at most 10 % slower than the baseline
    network = 0.2          # share: network at most 20 % of e2e
    slo = "ttft_ms=500,tpot_ms=50"   # the SLOs the next two judge (or report --slo)
    goodput_min = 2.0      # requests/s meeting every SLO, at least
    slo_attainment_min = 0.95        # share of requests meeting every SLO, at least

    [report]
    tolerance_pct = 5      # the default regression checks
    confidence = 0.95
    bootstrap = 2000

Parsing is strict: an unknown key or a bad value is one line naming the file
and the key (exit 3), because a typo in a gate silently disables it.
"""

from __future__ import annotations

import difflib
import math
import re
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tracetool.errors import BadInput, UsageError
from tracetool.report.stats import STATS
from tracetool.schema import COMPONENTS  # a share budget can name any component of the attribution
from tracetool.slo import parse_slo

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: Latency metrics a budget can name, in display order.
METRICS = ("ttft", "itl", "tpot", "e2e")
#: Budgets on the SLOs (the budget's ``slo`` string, or ``report --slo``).
SLO_KEYS = ("goodput_min", "slo_attainment_min")
#: The statistics the default regression checks gate on.
DEFAULT_STATS = ("p50", "p95")

_KEY = re.compile(r"^(?P<stat>mean|p50|p90|p95|p99)_(?P<metric>ttft|itl|tpot|e2e)_(?P<unit>ms|pct)$")


@dataclass(frozen=True)
class Settings:
    """The ``[report]`` table: how the comparison with the baseline is made.

    Attributes:
        tolerance_pct: slowdown the default regression checks allow, percent.
        confidence: two-sided confidence of the bootstrap intervals (0.5 .. 0.999).
        bootstrap: bootstrap resamples (200 .. 100000).
        seed: seed of the resampling; the same seed gives the same bytes.
        min_requests: fewest requests each side needs for a relative check to run (else skipped).
        default_checks: run the default p50/p95 regression checks when a baseline is given.
        unmeasured: ``skip`` or ``fail`` a budget the trace cannot measure.
    """

    tolerance_pct: float = 5.0
    confidence: float = 0.95
    bootstrap: int = 2000
    seed: int = 0
    min_requests: int = 3
    default_checks: bool = True
    unmeasured: str = "skip"


@dataclass(frozen=True)
class Limit:
    """One budget line.

    Attributes:
        key: the key as written (``p95_ttft_ms``, ``network``).
        kind: ``absolute`` (ms), ``relative`` (percent slower than the baseline) or ``share`` (0..1 of e2e).
        metric: ``ttft``, ``itl``, ``tpot``, ``e2e``, or the component for a share.
        stat: ``mean``, ``p50``, ``p90``, ``p95`` or ``p99``; None for a share.
        value: the limit.
    """

    key: str
    kind: str
    metric: str
    stat: str | None
    value: float


@dataclass(frozen=True)
class Budget:
    """A parsed budget file (or the empty budget when there is none)."""

    source: str | None = None
    limits: tuple[Limit, ...] = ()
    settings: Settings = field(default_factory=Settings)
    #: the SLOs (tracetool.slo syntax) that goodput_min and slo_attainment_min judge
    slo: str | None = None

    @property
    def relative(self) -> tuple[Limit, ...]:
        return tuple(lim for lim in self.limits if lim.kind == "relative")

    def require_baseline(self, has_baseline: bool) -> None:
        """A relative budget needs a baseline to compare with: a usage error (exit 2) without."""
        if self.relative and not has_baseline:
            keys = ", ".join(lim.key for lim in self.relative)
            raise UsageError(f"{self.source}: {keys} compare with a baseline: pass --baseline TRACE "
                             "(or drop the relative budgets)")


def load_budget(path: str | Path) -> Budget:
    """Read and check a budget file.

    Raises:
        BadInput: the file cannot be read, is not TOML, or has an unknown key or a bad value
            (the message names the file and the key).
    """
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise BadInput(f"{p}: budget file not found") from None
    except IsADirectoryError:
        raise BadInput(f"{p}: is a directory, not a budget file (TOML)") from None
    except UnicodeDecodeError:
        raise BadInput(f"{p}: budget file is not UTF-8 text") from None
    except OSError as e:
        raise BadInput(f"{p}: cannot read budget file ({e.strerror or e})") from e
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"{p}: not valid TOML: {e}") from e
    except RecursionError:  # tomllib recurses per nested array or inline table
        raise BadInput(f"{p}: not valid TOML: nested too deeply") from None
    return parse_budget(data, str(p))


def parse_budget(data: dict[str, Any], source: str) -> Budget:
    """Check a budget mapping (the TOML document) and return the :class:`Budget`."""
    limits: list[Limit] = []
    settings = Settings()
    slo: str | None = None
    for key, value in data.items():
        if key == "report":
            settings = _settings(value, source)
            continue
        if key == "slo":
            if not isinstance(value, str):
                raise BadInput(f"{source}: slo = {value!r}: expected a string like \"ttft_ms=500,tpot_ms=50\"")
            try:
                parse_slo(value)
            except UsageError as e:
                raise BadInput(f"{source}: {e}") from None
            slo = value
            continue
        if key in SLO_KEYS:
            x = _number(key, value, source)
            if x < 0 or (key == "slo_attainment_min" and x > 1):
                raise BadInput(f"{source}: {key} = {value!r}: " + ("a share in [0, 1]" if key == "slo_attainment_min"
                                                                 else "requests/s, 0 or more"))
            limits.append(Limit(key=key, kind="slo", metric=key, stat=None, value=x))
            continue
        m = _KEY.match(key)
        if m:
            limits.append(_metric_limit(key, value, m, source))
        elif key in COMPONENTS:
            share = _number(key, value, source)
            if not 0 < share <= 1:
                raise BadInput(f"{source}: {key} = {value!r}: a share budget is a fraction of e2e in (0, 1], "
                               "e.g. 0.2 for 20 %")
            limits.append(Limit(key=key, kind="share", metric=key, stat=None, value=share))
        else:
            raise BadInput(f"{source}: unknown key '{key}'{_suggest(key, _all_keys())}; budget keys are "
                           "<stat>_<metric>_ms, <stat>_<metric>_pct (stat: mean, p50, p90, p95, p99; metric: "
                           "ttft, itl, tpot, e2e), a component name, slo, goodput_min, slo_attainment_min, "
                           "or the [report] table")
    return Budget(source=source, limits=tuple(sorted(limits, key=_order)), settings=settings, slo=slo)


def _metric_limit(key: str, value: Any, m: re.Match[str], source: str) -> Limit:
    x = _number(key, value, source)
    if m["unit"] == "ms":
        if x <= 0:
            raise BadInput(f"{source}: {key} = {value!r}: an absolute budget is a positive number of ms")
        return Limit(key=key, kind="absolute", metric=m["metric"], stat=m["stat"], value=x)
    if x < 0:
        raise BadInput(f"{source}: {key} = {value!r}: a relative budget is the slowdown allowed, "
                       "percent, 0 or more")
    return Limit(key=key, kind="relative", metric=m["metric"], stat=m["stat"], value=x)


def _settings(value: Any, source: str) -> Settings:
    if not isinstance(value, dict):
        raise BadInput(f"{source}: report must be a table ([report]), not {type(value).__name__}")
    known = {f.name for f in fields(Settings)}
    out: dict[str, Any] = {}
    for key, v in value.items():
        where = f"report.{key}"
        if key not in known:
            raise BadInput(f"{source}: unknown key '{where}'{_suggest(key, sorted(known), 'report.')}; "
                           f"[report] keys are {', '.join(sorted(known))}")
        if key == "default_checks":
            if not isinstance(v, bool):
                raise BadInput(f"{source}: {where} = {v!r}: expected true or false")
            out[key] = v
        elif key == "unmeasured":
            if v not in ("skip", "fail"):
                raise BadInput(f"{source}: {where} = {v!r}: expected \"skip\" or \"fail\"")
            out[key] = v
        elif key in ("bootstrap", "seed", "min_requests"):
            if isinstance(v, bool) or not isinstance(v, int):
                raise BadInput(f"{source}: {where} = {v!r}: expected an integer")
            lo, hi = {"bootstrap": (200, 100_000), "seed": (0, 2**63 - 1), "min_requests": (2, 1_000_000)}[key]
            if not lo <= v <= hi:
                raise BadInput(f"{source}: {where} = {v!r}: expected an integer from {lo} to {hi}")
            out[key] = v
        else:
            x = _number(where, v, source)
            if key == "confidence" and not 0.5 <= x <= 0.999:
                raise BadInput(f"{source}: {where} = {v!r}: expected a confidence from 0.5 to 0.999")
            if key == "tolerance_pct" and x < 0:
                raise BadInput(f"{source}: {where} = {v!r}: expected a slowdown in percent, 0 or more")
            out[key] = x
    return Settings(**out)


def _number(key: str, value: Any, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInput(f"{source}: {key} = {value!r}: expected a number, not {type(value).__name__}")
    x = float(value)
    if not math.isfinite(x):
        raise BadInput(f"{source}: {key} = {value!r}: expected a finite number")
    return x


def _all_keys() -> list[str]:
    keys = [f"{s}_{m}_{u}" for s in STATS for m in METRICS for u in ("ms", "pct")]
    return [*keys, *COMPONENTS, "slo", *SLO_KEYS, "report"]


def _suggest(key: str, choices: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
    return f" (did you mean '{prefix}{close[0]}'?)" if close else ""


def _order(lim: Limit) -> tuple[int, int, int]:
    kinds = ("relative", "absolute", "share", "slo")
    if lim.kind == "slo":
        return (kinds.index(lim.kind), SLO_KEYS.index(lim.metric), 0)
    if lim.kind == "share":
        return (kinds.index(lim.kind), COMPONENTS.index(lim.metric), 0)
    assert lim.stat is not None
    return (kinds.index(lim.kind), METRICS.index(lim.metric), STATS.index(lim.stat))


__all__ = ["COMPONENTS", "DEFAULT_STATS", "METRICS", "Budget", "Limit", "Settings", "load_budget",
           "parse_budget"]
