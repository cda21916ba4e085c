"""What every fuzz test shares: the CLI run in-process, the "clean failure" property, budgets.

The property every reader must keep, whatever the bytes: the command returns
0 (the input was valid after all) or 3 (bad input) with exactly one line
``tracetool: error: ...`` on stderr, never raises, never prints a
traceback, and returns in bounded time. Memory is checked on a sample in
subprocesses under ``RLIMIT_AS`` (:func:`run_limited`) and in-process by the
growth of the peak RSS over a whole campaign (:func:`peak_rss_mib`).

Budgets: ``TRACETOOL_FUZZ_EXAMPLES`` scales every campaign (the default keeps
CI to about a minute for the whole layer; the long campaign in docs/security.md
sets it to 20000). Each test's budget is a fraction of it (``examples(0.5)``).
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings

from tracetool.cli import main as cli_main

CORPUS = Path(__file__).resolve().parent / "corpus"
REPO = Path(__file__).resolve().parents[2]
#: Examples per campaign unit; CI default. TRACETOOL_FUZZ_EXAMPLES=20000 is the long campaign.
DEFAULT_EXAMPLES = 120
#: One command on one fuzzed input must answer within this (the inputs are a few KB).
SLOW_CALL_S = 30.0

#: Counts of inputs tried per campaign in this process (printed by the session summary).
TRIED: dict[str, int] = {}


def budget() -> int:
    raw = os.environ.get("TRACETOOL_FUZZ_EXAMPLES", "")
    return int(raw) if raw.strip().isdigit() and int(raw) > 0 else DEFAULT_EXAMPLES


def examples(share: float = 1.0, floor: int = 10) -> int:
    """This campaign's example count: ``share`` of the budget, at least ``floor``."""
    return max(floor, int(budget() * share))


def fuzz_settings(share: float = 1.0, floor: int = 10) -> Any:
    """Hypothesis settings of a campaign: no deadline (a shared machine), no shrinking limits on CI."""
    return settings(max_examples=examples(share, floor), deadline=None, database=None,
                    derandomize=os.environ.get("TRACETOOL_FUZZ_RANDOM") is None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much, HealthCheck.large_base_example],
                    print_blob=True)


@dataclass
class Run:
    args: list[str]
    code: int
    out: str
    err: str
    seconds: float


def run_cli(*args: Any) -> Run:
    """``tracetool ARGS`` in-process, stdout and stderr captured; a bug is exit 70, which no campaign allows."""
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(argv)
    return Run(argv, code, out.getvalue(), err.getvalue(), time.monotonic() - t0)


def assert_clean(r: Run, allowed: Sequence[int] = (0, 3)) -> None:
    """The reader's contract on any input: an allowed exit code, one error line, no traceback, fast."""
    where = f"tracetool {' '.join(r.args)}"
    assert r.code in allowed, f"{where}: exit {r.code}\n{r.err}"
    assert "Traceback" not in r.err, f"{where}: traceback\n{r.err}"
    errors = [ln for ln in r.err.splitlines() if ln.startswith("tracetool: error:")]
    if r.code in (2, 3):
        assert len(errors) == 1, f"{where}: exit {r.code} wants exactly one error line, got\n{r.err}"
        assert len(errors[0]) < 2000, f"{where}: error line of {len(errors[0])} chars"
    else:  # 0 ok, 1 a gate failed (its FAIL lines): the command worked
        assert not errors, f"{where}: exit {r.code} with an error line\n{r.err}"
    assert r.seconds < SLOW_CALL_S, f"{where}: took {r.seconds:.1f} s"


def tried(campaign: str, n: int = 1) -> None:
    TRIED[campaign] = TRIED.get(campaign, 0) + n


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_limited(args: Sequence[Any], *, mem_mib: int = 3072, timeout_s: float = 60.0,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m tracetool ARGS`` in a child whose address space is capped at ``mem_mib``.

    A reader that tried to allocate what a corrupt length field claims would
    die with MemoryError (a traceback) or be killed, instead of quietly
    swapping; the cap sits well above what these small inputs need.
    """
    limit = mem_mib << 20

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "tracetool", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout_s, preexec_fn=cap, env=full_env)


def assert_clean_process(p: subprocess.CompletedProcess[str], allowed: Sequence[int] = (0, 3)) -> None:
    where = " ".join(map(str, p.args))
    assert p.returncode in allowed, f"{where}: exit {p.returncode}\n{p.stderr[-3000:]}"
    assert "Traceback" not in p.stderr, f"{where}: traceback\n{p.stderr[-3000:]}"
    if p.returncode in (2, 3):
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith("tracetool: error:")]
        assert len(errors) == 1, f"{where}: wants one error line\n{p.stderr[-3000:]}"
