"""The one way a test waits for something another thread or process makes true.

Wait on what the code exposes (an endpoint's stats, a sampler's tick count, the rows a file holds,
a widget's text), never on the clock: :func:`wait_until` returns as soon as the condition holds and
fails at ``timeout`` with what it waited for. Where the code signals (a ``threading.Condition``, a
Textual worker, ``Popen.wait``), await that instead; this is for conditions nothing signals. The
timeout is a safety net for a loaded two-core machine, far above the time the wait takes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: The default safety net, seconds.
TIMEOUT_S = 30.0


def wait_until(condition: Callable[[], T], what: str, *, timeout: float = TIMEOUT_S,
               interval: float = 0.02) -> T:
    """Poll ``condition`` every ``interval`` seconds until it returns a true value, and return it.

    Raises:
        AssertionError: ``timed out after N s waiting for WHAT`` when ``timeout`` passes first (the
            condition is tried once more at the end, so a slow poll cannot miss a late success).
    """
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= end:
            value = condition()
            if value:
                return value
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


async def wait_until_async(condition: Callable[[], T], what: str, *, timeout: float = TIMEOUT_S,
                           interval: float = 0.02, pilot: Any = None) -> T:
    """:func:`wait_until` inside an event loop (a Textual Pilot test): between polls the loop runs
    (``pilot.pause(interval)`` when a pilot is given, so the app processes its messages)."""
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        if pilot is not None:
            await pilot.pause(interval)
        else:
            await asyncio.sleep(interval)


__all__ = ["TIMEOUT_S", "wait_until", "wait_until_async"]
