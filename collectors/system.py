"""Start and stop the system collectors (NVML GPU sampler, py-spy CPU sampler) in one call.

This is what ``tracetool record`` / ``tracetool serve`` wire their flags to:

    handle = start_system_collectors(recorder, nvml_hz=args.nvml, pyspy_hz=args.pyspy, pid=child.pid)

or, one sampler per flag with the ``start(recorder, hz, pid)`` signature of
``collectors.launcher.SAMPLERS``: :func:`start_nvml` and :func:`start_pyspy`.

``--nvml[=HZ]`` (default 10, at most 100) and ``--pyspy[=HZ]`` (default 100,
at most 500) map to ``nvml_hz`` / ``pyspy_hz``; None leaves a collector off.
The handle stops itself when the recorder closes (``recorder.on_close``), so
the ``gpu`` and ``stacks`` rows are in the trace before ``meta.json`` is
finalised; calling :meth:`SystemCollectors.stop` earlier is fine too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from collectors.nvml import DEFAULT_HZ as NVML_DEFAULT_HZ
from collectors.nvml import MAX_HZ as NVML_MAX_HZ
from collectors.nvml import NvmlApi, NvmlSampler, check_hz
from collectors.pyspy import DEFAULT_HZ as PYSPY_DEFAULT_HZ
from collectors.pyspy import MAX_HZ as PYSPY_MAX_HZ
from collectors.pyspy import PySpySampler
from tracetool.errors import UsageError

__all__ = ["NVML_DEFAULT_HZ", "NVML_MAX_HZ", "PYSPY_DEFAULT_HZ", "PYSPY_MAX_HZ", "SystemCollectors",
           "start_nvml", "start_pyspy", "start_system_collectors"]


@dataclass
class SystemCollectors:
    """The running system collectors; :meth:`stop` ends them all (idempotent, never raises)."""

    nvml: NvmlSampler | None = None
    pyspy: PySpySampler | None = None
    _stopped: bool = field(default=False, repr=False)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for c in (self.pyspy, self.nvml):
            if c is not None:
                try:
                    c.stop()
                except Exception:  # stop() never raises by contract; belt and braces for the host
                    pass

    def __enter__(self) -> SystemCollectors:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_system_collectors(recorder: Any, nvml_hz: float | None = None, pyspy_hz: float | None = None,
                            pid: int | None = None, *, pyspy_rules: Sequence[str | os.PathLike[str]] = (),
                            nvml_api: NvmlApi | None = None) -> SystemCollectors:
    """Start the collectors asked for and register their stop with ``recorder.on_close``.

    Args:
        recorder: a started :class:`collectors.Recorder`.
        nvml_hz: GPU sampling rate (``--nvml[=HZ]``); None = off.
        pyspy_hz: CPU stack sampling rate (``--pyspy[=HZ]``); None = off.
        pid: the process py-spy samples (``record``: the child it runs; default this process).
        pyspy_rules: extra category rules files (``--pyspy-rules FILE``), tried first.
        nvml_api: an NVML surface other than real ``pynvml`` (tests only).

    Raises:
        UsageError: a rate out of range (exit 2).
        PySpyError: py-spy is missing, lacks ptrace permission, or the process is gone (exit 3).

    A missing GPU or NVML driver is not an error: one line on stderr, a note in
    ``meta.json``, no ``gpu`` table.
    """
    if nvml_hz is not None:
        check_hz(nvml_hz, what="--nvml", max_hz=NVML_MAX_HZ)
    if pyspy_hz is not None and check_hz(pyspy_hz, what="--pyspy", max_hz=PYSPY_MAX_HZ) < 1:
        raise UsageError(f"--pyspy: py-spy samples at whole rates, at least 1 Hz, got {pyspy_hz!r}")
    handle = SystemCollectors()
    try:
        if pyspy_hz is not None:  # first: the one that can fail, before a GPU thread is running
            handle.pyspy = PySpySampler(recorder, pid, float(pyspy_hz), rules=pyspy_rules).start()
        if nvml_hz is not None:
            handle.nvml = NvmlSampler(recorder, float(nvml_hz), api=nvml_api).start()
    except BaseException:
        handle.stop()
        raise
    recorder.on_close(handle.stop)
    return handle


def start_nvml(recorder: Any, hz: float = NVML_DEFAULT_HZ, pid: int | None = None) -> SystemCollectors:
    """``--nvml[=HZ]``: the NVML sampler alone (``pid`` is ignored: NVML samples the machine's GPUs)."""
    return start_system_collectors(recorder, nvml_hz=hz)


def start_pyspy(recorder: Any, hz: float = PYSPY_DEFAULT_HZ, pid: int | None = None) -> SystemCollectors:
    """``--pyspy[=HZ]``: the py-spy sampler alone, on ``pid`` (default this process)."""
    return start_system_collectors(recorder, pyspy_hz=hz, pid=pid)
