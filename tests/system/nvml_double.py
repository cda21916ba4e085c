"""A scripted NVML double for tests and the sampler benchmark (never used by the product).

It implements :class:`collectors.nvml.NvmlApi`: each GPU has, per field, a
script of values in NVML's own units (milliwatts, KiB/s, bytes, MHz,
percent) that successive reads replay (the last entry repeats). An entry that
is an exception class or instance is raised instead: use the real
``pynvml.NVMLError_*`` classes, so the sampler's error handling is the one
that meets real NVML.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: Raw NVML readings of a busy H100 during decode (plausible, made up for tests).
H100_READINGS: dict[str, list[Any]] = {
    "utilization": [(97.0, 81.0)],
    "memory_used_bytes": [71_000_000_000],
    "power_mw": [612_345],
    "clock_sm": [1980],
    "clock_mem": [2619],
    "clock_event_reasons": [0x1],
    "pcie_tx": [2048],
    "pcie_rx": [4096],
    # GPM metrics by NVML metric id: DRAM_BW_UTIL 10, SM_UTIL 2, SM_OCCUPANCY 3, ANY_TENSOR_UTIL 5
    "gpm": [{10: 83.5, 2: 91.0, 3: 44.0, 5: 12.5}],
}


@dataclass
class GpuScript:
    """What one GPU answers: its name, GPM support, and per-field value scripts."""

    name: str = "NVIDIA H100 80GB HBM3"
    gpm_supported: Any = True
    readings: dict[str, list[Any]] = field(default_factory=lambda: {k: list(v) for k, v in H100_READINGS.items()})


class ScriptedNvml:
    """Replays :class:`GpuScript` readings; counts calls; lets tests await N samples."""

    def __init__(self, gpus: Sequence[GpuScript] = (GpuScript(),), *, init_error: Any = None) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        self.calls: dict[tuple[int, str], int] = {}
        self.samples_read = 0
        self.allocated = 0
        self.freed = 0
        self.initialised = False
        self.shut_down = False
        self._cond = threading.Condition()

    # -- script replay -------------------------------------------------------------
    def _next(self, gpu: int, key: str) -> Any:
        script = self.gpus[gpu].readings.get(key)
        n = self.calls.get((gpu, key), 0)
        self.calls[(gpu, key)] = n + 1
        if not script:
            raise AssertionError(f"no script for {key} on GPU {gpu}")
        value = script[min(n, len(script) - 1)]
        _raise_if_error(value)
        return value

    def wait_samples(self, n: int, timeout: float = 10.0) -> bool:
        """Block until ``utilization`` (first read of every sample) was read ``n`` times in all."""
        with self._cond:
            return self._cond.wait_for(lambda: self.samples_read >= n, timeout)

    # -- NvmlApi -------------------------------------------------------------------
    def init(self) -> None:
        _raise_if_error(self.init_error)
        self.initialised = True

    def shutdown(self) -> None:
        self.shut_down = True

    def device_count(self) -> int:
        return len(self.gpus)

    def name(self, gpu: int) -> str:
        return self.gpus[gpu].name

    def utilization(self, gpu: int) -> tuple[float, float]:
        try:
            value = self._next(gpu, "utilization")
        finally:
            with self._cond:
                self.samples_read += 1
                self._cond.notify_all()
        return tuple(value)  # type: ignore[return-value]

    def memory_used_bytes(self, gpu: int) -> int:
        return int(self._next(gpu, "memory_used_bytes"))

    def power_mw(self, gpu: int) -> int:
        return int(self._next(gpu, "power_mw"))

    def clock_mhz(self, gpu: int, clock: str) -> int:
        return int(self._next(gpu, f"clock_{clock}"))

    def clock_event_reasons(self, gpu: int) -> int:
        return int(self._next(gpu, "clock_event_reasons"))

    def pcie_kib_per_s(self, gpu: int, direction: str) -> int:
        return int(self._next(gpu, f"pcie_{direction}"))

    def gpm_supported(self, gpu: int) -> bool:
        value = self.gpus[gpu].gpm_supported
        _raise_if_error(value)
        return bool(value)

    def gpm_sample(self, gpu: int, buffer: Any | None) -> Any:
        if buffer is None:
            self.allocated += 1
            buffer = {"gpu": gpu}
        self._next(gpu, "gpm_sample") if "gpm_sample" in self.gpus[gpu].readings else None
        return buffer

    def gpm_metrics(self, first: Any, second: Any, metric_ids: Sequence[int]) -> list[float | None]:
        values = self._next(second["gpu"], "gpm")
        return [values.get(m) for m in metric_ids]

    def gpm_free(self, buffer: Any) -> None:
        self.freed += 1


def _raise_if_error(value: Any) -> None:
    if isinstance(value, BaseException):
        raise value
    if isinstance(value, type) and issubclass(value, BaseException):
        raise value()
