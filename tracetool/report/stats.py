"""The statistics of the CI report: percentiles, a request-level bootstrap, Mann-Whitney.

Why a bootstrap over *requests*: a CI run holds a handful of requests, and the
values inside one request are not independent (its tokens share a context
length, a batch, a moment of load). Resampling requests as units keeps that
correlation inside each resample, so the interval is as wide as the run-to-run
noise really is; resampling tokens would pretend a 300-token request is 300
independent draws and make every jitter look significant.

Everything is vectorised with numpy and seeded, so a report is deterministic:
the same two traces give the same interval bytes on every run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Statistics a check can use, in display order.
STATS = ("mean", "p50", "p90", "p95", "p99")
QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}

#: Above this many values the bootstrap works on per-request summaries (see Sample.compressed).
MAX_POINTS = 4_000
#: Cells of the (resamples x values) weight matrix handled at once; bounds memory to ~32 MB.
_CHUNK_CELLS = 4_000_000


@dataclass(frozen=True)
class Sample:
    """One metric's values and the request each came from (the bootstrap's resampling unit).

    Attributes:
        values: the measured values (ms), float64.
        groups: for each value, its request as a dense index ``0 .. n_groups - 1``.
        n_groups: requests that contributed at least one value.
        weights: how many original values each entry stands for (1 unless compressed).
    """

    values: np.ndarray
    groups: np.ndarray
    n_groups: int
    weights: np.ndarray

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray, groups: Sequence[object] | np.ndarray | None = None
           ) -> Sample:
        """Build a sample; ``groups`` holds any hashable request key per value (None: one value each)."""
        v = np.asarray(values, dtype=np.float64)
        if groups is None:
            g = np.arange(len(v), dtype=np.int64)
        else:
            _, g = np.unique(np.asarray(groups), return_inverse=True)
            g = g.astype(np.int64).reshape(-1)
        keep = np.isfinite(v)
        v, g = v[keep], g[keep]
        if len(g):  # dense group ids over the requests that kept a value
            _, g = np.unique(g, return_inverse=True)
            g = g.astype(np.int64).reshape(-1)
        n = int(g.max()) + 1 if len(g) else 0
        return cls(values=v, groups=g, n_groups=n, weights=np.ones(len(v), dtype=np.int64))

    @property
    def n(self) -> int:
        """Values the sample stands for (tokens for ITL, requests otherwise)."""
        return int(self.weights.sum())

    def stat(self, name: str) -> float | None:
        """The point estimate on the full data (numpy's linear percentile, as the analyzers)."""
        if self.n == 0:
            return None
        if self.n == len(self.values):
            if name == "mean":
                return float(np.mean(self.values))
            return float(np.quantile(self.values, QUANTILES[name]))
        return float(_resampled(self, np.ones((1, self.n_groups), dtype=np.int64), name)[0])

    def group_means(self) -> np.ndarray:
        """Each request's mean value: the unit Mann-Whitney compares."""
        sums = np.bincount(self.groups, weights=self.values * self.weights, minlength=self.n_groups)
        counts = np.bincount(self.groups, weights=self.weights, minlength=self.n_groups)
        return np.asarray(sums / counts, dtype=np.float64)

    def compressed(self, max_points: int = MAX_POINTS) -> Sample:
        """At most ~``max_points`` entries: each request's sorted values cut into equal runs,
        each run kept as its median with the run's length as weight.

        Requests stay the resampling unit and keep their share of the values, so the
        bootstrap distribution of a percentile changes by less than the spread inside
        one run; the point estimate (:meth:`stat` on the uncompressed sample) is exact.
        """
        total = len(self.values)
        if total <= max_points:
            return self
        vals, grps, wts = [], [], []
        order = np.lexsort((self.values, self.groups))
        v, g = self.values[order], self.groups[order]
        bounds = np.flatnonzero(np.diff(g)) + 1
        for gi, run in enumerate(np.split(v, bounds)):
            k = max(1, math.ceil(len(run) * max_points / total))
            for part in np.array_split(run, k):
                vals.append(float(np.median(part)))
                grps.append(gi)
                wts.append(len(part))
        return Sample(values=np.asarray(vals), groups=np.asarray(grps, dtype=np.int64), n_groups=self.n_groups,
                      weights=np.asarray(wts, dtype=np.int64))


@dataclass(frozen=True)
class Interval:
    """A relative difference (candidate ÷ baseline − 1) and its bootstrap interval, as fractions."""

    estimate: float
    low: float
    high: float


def resample_counts(n_groups: int, iterations: int, rng: np.random.Generator) -> np.ndarray:
    """``iterations`` bootstrap resamples of ``n_groups`` requests, as counts (iterations x n_groups)."""
    idx = rng.integers(0, n_groups, size=(iterations, n_groups))
    flat = idx + (np.arange(iterations, dtype=np.int64) * n_groups)[:, None]
    return np.bincount(flat.ravel(), minlength=iterations * n_groups).reshape(iterations, n_groups)


def bootstrap_relative(base: Sample, cand: Sample, stats: Sequence[str], *, iterations: int = 2000,
                       confidence: float = 0.95, seed: int | Sequence[int] = 0) -> dict[str, Interval]:
    """Percentile-bootstrap intervals of ``stat(cand) / stat(base) − 1`` for each statistic.

    Both traces are resampled independently, requests as units (a request's values
    travel together); every statistic uses the same resamples. Resamples whose baseline
    statistic is 0 are dropped (the ratio is undefined there).

    Raises:
        ValueError: a sample is empty or a statistic is 0 on the full baseline.
    """
    if base.n_groups == 0 or cand.n_groups == 0:
        raise ValueError("empty sample")
    rng = np.random.default_rng(seed)
    wb = resample_counts(base.n_groups, iterations, rng)
    wc = resample_counts(cand.n_groups, iterations, rng)
    bz, cz = base.compressed(), cand.compressed()
    alpha = (1.0 - confidence) / 2.0
    out: dict[str, Interval] = {}
    rb_all, rc_all = _resampled_many(bz, wb, stats), _resampled_many(cz, wc, stats)
    for name in stats:
        b0, c0 = base.stat(name), cand.stat(name)
        if not b0 or c0 is None:
            raise ValueError(f"{name} of the baseline is 0")
        rb, rc = rb_all[name], rc_all[name]
        ok = rb > 0
        rel = rc[ok] / rb[ok] - 1.0
        low, high = np.quantile(rel, [alpha, 1.0 - alpha])
        out[name] = Interval(estimate=c0 / b0 - 1.0, low=float(low), high=float(high))
    return out


def _resampled(s: Sample, counts: np.ndarray, name: str) -> np.ndarray:
    """The statistic on each resample: ``counts[b, g]`` copies of request g's values."""
    return _resampled_many(s, counts, [name])[name]


def _resampled_many(s: Sample, counts: np.ndarray, names: Sequence[str]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    if "mean" in names:
        sums = np.bincount(s.groups, weights=s.values * s.weights, minlength=s.n_groups)
        ns = np.bincount(s.groups, weights=s.weights, minlength=s.n_groups)
        out["mean"] = np.asarray((counts @ sums) / (counts @ ns), dtype=np.float64)
    qs = [(name, QUANTILES[name]) for name in names if name != "mean"]
    if not qs:
        return out
    order = np.argsort(s.values, kind="stable")
    v, g, w = s.values[order], s.groups[order], s.weights[order]
    for name, _ in qs:
        out[name] = np.empty(counts.shape[0], dtype=np.float64)
    step = max(1, _CHUNK_CELLS // max(1, len(v)))
    last = len(v) - 1
    for start in range(0, counts.shape[0], step):
        # weight of each sorted value in each resample; the linear percentile of the
        # multiset it describes is read off the cumulative weights (numpy's 'linear').
        block = np.take(counts[start:start + step].astype(np.int32), g, axis=1)
        cum = np.cumsum(block * w.astype(np.int32), axis=1, dtype=np.int64)
        total = cum[:, -1]
        for name, q in qs:
            h = (total - 1) * q
            lo = np.floor(h)
            frac = h - lo
            i_lo = (cum <= lo[:, None]).sum(axis=1)
            i_hi = np.minimum((cum <= (lo + 1)[:, None]).sum(axis=1), last)
            out[name][start:start + step] = v[i_lo] + frac * (v[i_hi] - v[i_lo])
    return out


def mann_whitney_greater(base: np.ndarray, cand: np.ndarray) -> float | None:
    """One-sided p-value that ``cand`` tends to be larger than ``base`` (Mann-Whitney U).

    Normal approximation with tie and continuity corrections; a cross-check shown
    beside the bootstrap, not a gate (with a handful of requests it is coarse).
    None when either side is empty or every value is tied.
    """
    x, y = np.asarray(base, dtype=np.float64), np.asarray(cand, dtype=np.float64)
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        return None
    both = np.concatenate([x, y])
    ranks = _average_ranks(both)
    u = float(ranks[n1:].sum() - n2 * (n2 + 1) / 2.0)  # U of the candidate
    _, ties = np.unique(both, return_counts=True)
    n = n1 + n2
    tie_term = float((ties ** 3 - ties).sum()) / (n * (n - 1)) if n > 1 else 0.0
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term)
    if var <= 0:
        return None
    z = (u - n1 * n2 / 2.0 - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _average_ranks(a: np.ndarray) -> np.ndarray:
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a), dtype=np.float64)
    ranks[order] = np.arange(1, len(a) + 1, dtype=np.float64)
    _, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return np.asarray(sums[inv] / counts[inv], dtype=np.float64)


__all__ = ["MAX_POINTS", "QUANTILES", "STATS", "Interval", "Sample", "bootstrap_relative",
           "mann_whitney_greater", "resample_counts"]
