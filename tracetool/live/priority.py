"""Observers yield the CPU to what they observe.

The live endpoint process and ``tracetool attach`` often run on the same host as
the server they watch. Both lower their CPU priority (``nice``), so that when
the host is short of CPU the scheduler gives it to the server first; on an idle
core a niced process runs exactly as fast. On a 2-core box (the soak's server
at concurrency 32 with an ``attach --record`` viewer, per-thread CPU from /proc)
the viewer's and endpoint's wake-ups at equal priority preempted the engine and
cooled its caches: the engine thread spent more CPU per token and the server
served fewer tokens per second than without a viewer; with both niced, as many
as without one.

On Linux a nice value belongs to a thread and is inherited by the threads and
processes it starts, so this is called first, from the main thread.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

#: The nice increment of the live endpoint process and (default ``--nice``) of ``tracetool attach``.
OBSERVER_NICE = 10


def lower_priority(increment: int = OBSERVER_NICE) -> int | None:
    """Raise this thread's nice value by ``increment`` (0: leave it); the new value, or None
    where the platform has no ``nice`` or refuses (the caller goes on at its priority)."""
    if increment <= 0:
        return None
    try:
        return os.nice(increment)
    except (AttributeError, OSError):
        return None


@contextlib.contextmanager
def observer_priority(increment: int = OBSERVER_NICE) -> Iterator[int | None]:
    """:func:`lower_priority` for the duration of a block, then back where allowed (raising a
    priority needs privileges; without them it stays lowered, which only a caller that goes on
    in-process after the block, a test for instance, can notice)."""
    before = _current()
    now = lower_priority(increment)
    try:
        yield now
    finally:
        if now is not None and before is not None:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, 0, before)


def _current() -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, 0)
    except (AttributeError, OSError):
        return None
