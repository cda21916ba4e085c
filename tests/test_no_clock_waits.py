"""Tests wait on what the code exposes, never on the clock (tests/waiting.py says how).

A grep of tests/ for the shapes a clock wait takes: ``time.sleep``, ``asyncio.sleep``, a throwaway
``threading.Event().wait(…)`` used as a sleep, and a ``while`` loop whose body only waits a fixed
time (``pilot.pause(…)``, ``x.wait(0.05)``): a poll with no time limit. Each use that remains is
listed below with why it is not a test waiting on the clock: a test server's simulated latency or
stall, a producer's pacing, a moment chosen at random on purpose, and the wait helpers themselves.
A new one fails here: wait with :func:`tests.waiting.wait_until` on a condition instead, or add it
to the list with its reason.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent

_SLEEP = re.compile(r"\btime\.sleep\(|\basyncio\.sleep\(|\banyio\.sleep\(|\bEvent\(\)\.wait\(|(?<![\w.])sleep\(")
_FIXED_WAIT = re.compile(r"^\s*(await\s+)?[\w.]*(\.pause|\.wait)\([\d.]*\)\s*(#.*)?$")

SIMULATED = "a test server's simulated latency (what the client under test measures)"
STALL = "a test server that stalls or drips on purpose (the fault under test)"
PACING = "a producer's pacing (traffic for the code under test), not a wait for a result"
RANDOM = "a moment chosen at random on purpose (where the kill lands is the test's dice)"

#: (path under tests/, the line stripped, why it is no clock wait), once per occurrence.
ALLOWED: list[tuple[str, str, str]] = [
    ("waiting.py", "time.sleep(interval)", "wait_until's poll interval (the one wait helper)"),
    ("waiting.py", "await asyncio.sleep(interval)", "wait_until_async's poll interval (the one wait helper)"),
    ("otlp/vllm_shaped_server.py", "await asyncio.sleep(FRONTEND_S)", SIMULATED),
    ("otlp/vllm_shaped_server.py", "await asyncio.sleep(PREFILL_BASE_S + PREFILL_S_PER_WORD * prompt_len)",
     SIMULATED),
    ("otlp/vllm_shaped_server.py", "await asyncio.sleep(DECODE_STEP_S)", SIMULATED),
    ("serving/recording_double.py", "await asyncio.sleep(self.service_s)", SIMULATED),
    ("serving/scripts/middleware_server.py", "await asyncio.sleep(0.003)", SIMULATED),
    ("serving/engine_metrics_server.py", "await asyncio.sleep(self.prefill_s)", SIMULATED),
    ("serving/engine_metrics_server.py", "await asyncio.sleep(self.token_s)", SIMULATED),
    ("serving/openai_doubles.py", "await asyncio.sleep(PROMPT_MS / 1000)", SIMULATED),
    ("serving/openai_doubles.py", "await asyncio.sleep(PREDICTED_MS / 1000 / (TOKENS - 1))", SIMULATED),
    ("live/test_reconnect.py", "time.sleep(0.5)  # still being written when the other streams have ended",
     "a test server whose last stream ends late on purpose (the closing order under test)"),
    ("serving/engine_metrics_server.py", "await asyncio.sleep(0.05)",
     STALL + ": /metrics hangs until the server shuts down"),
    ("faults/hostile_server.py", "await asyncio.sleep(0.05)", STALL + ": a byte every 50 ms (drip /models)"),
    ("faults/hostile_server.py", "await asyncio.sleep(0.05)", STALL + ": a byte every 50 ms (drip stream)"),
    ("faults/hostile_server.py", "await asyncio.sleep(3600)", STALL + ": stops mid-stream"),
    ("serving/fakes.py", "await asyncio.sleep(3600)", STALL + ": never answers"),
    ("live/scripts/stream_tokens.py", "time.sleep(0.01)", PACING),
    ("live/live_helpers.py", "time.sleep(pause_s)", PACING),
    ("unit/test_sigkill.py", "time.sleep(rng.uniform(0, 0.05))  # kill at a random moment, not right after a flush",
     RANDOM),
    ("faults/test_fault_sigkill.py", "time.sleep(0.05)", RANDOM + "; the rows are read between the throws"),
    ("integration/conftest.py", "time.sleep(0.1)",
     "teardown of a process group: a grace period before SIGKILL, which nothing signals (waitpid "
     "reaps only the leader)"),
    ("unit/test_roundtrip.py", "self._cv.wait(0.05)  # to see stop (close() sets it without telling us)",
     "a fake clock's own wait, woken when the test advances time; bounded by its deadline"),
]


def clock_waits(text: str) -> list[str]:
    """The lines of one file that wait on the clock: a sleep, or a fixed wait alone in a ``while``."""
    found, previous = [], ""
    for line in text.splitlines():
        code = line.split("#", 1)[0]
        if _SLEEP.search(code) or (previous.lstrip().startswith("while ") and _FIXED_WAIT.match(line)):
            found.append(line.strip())
        if line.strip():
            previous = line
    return found


def test_no_test_waits_on_the_clock() -> None:
    found = Counter((str(p.relative_to(TESTS)), line) for p in sorted(TESTS.rglob("*.py"))
                    if p.name != Path(__file__).name for line in clock_waits(p.read_text()))
    allowed = Counter((path, line) for path, line, _why in ALLOWED)
    assert sorted((found - allowed).elements()) == [], "wait on a condition (tests/waiting.py) or list it here"
    assert sorted((allowed - found).elements()) == [], "a listed wait is gone: take it off the list"


def test_the_grep_finds_each_shape() -> None:
    for text in ["time.sleep(0.2)", "await asyncio.sleep(0.05)", "threading.Event().wait(0.2)",
                 "from time import sleep\nsleep(1)", "while app.snapshot is None:\n    await pilot.pause(0.05)",
                 "while not done:\n    r._done.wait(0.05)  # the short one finishes"]:
        assert clock_waits(text), text
    for text in ["assert done.wait(30)", "wait_until(lambda: engine.load == (0, 0), 'the slot free')",
                 "# time.sleep(1) in a comment", "while True:\n    n += 1", "await pilot.pause()"]:
        assert not clock_waits(text), text
