"""NVML GPU sampler: a background thread that writes the ``gpu`` table.

Why it is built this way (after nvitop's API layer):

* Every NVML call goes through one wrapper, :class:`Nvml`. It initialises the
  library lazily, turns an unsupported field into a null (said once on
  stderr, once in ``meta.json``) and stops asking for it, and turns a lost GPU
  into the end of sampling for that GPU, with a note. Nothing raises into the
  host.
* The wrapper talks to the library through :class:`NvmlApi`, a narrow
  protocol over exactly the reads the sampler needs. :class:`PynvmlApi` is the
  only implementation in the product (real ``pynvml``); tests drive the same
  code with a scripted double that raises the real ``pynvml.NVMLError_*``
  classes. No simulated value is ever written by the product.
* GPM metrics (Hopper and newer) come from two ``nvmlGpmSampleGet`` samples at
  least :data:`GPM_MIN_WINDOW_S` apart (NVML's refresh period), so at rates
  above 10 Hz only the rows that close a GPM window carry GPM values.
* ``nvmlDeviceGetPcieThroughput`` measures over 20 ms and blocks for it, per
  direction; the sampler reads it for one GPU at a time, each GPU about once
  per :data:`PCIE_PERIOD_S`, so it never stalls a 100 Hz loop for long.

Units written (see ``tracetool.schema.GPU``): percent, watts, megahertz,
bytes, bytes per second. NVML reports power in milliwatts and PCIe throughput
in KiB/s; both are converted here.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from tracetool.errors import UsageError
from tracetool.notices import say_once
from tracetool.presets import match_gpu_name
from tracetool.schema import GPU

DEFAULT_HZ = 10.0
MAX_HZ = 100.0
#: NVML refreshes GPM counters about every 100 ms; shorter windows read garbage.
GPM_MIN_WINDOW_S = 0.1
#: A 10 Hz loop wakes a little early now and then; a window this much short still counts.
_GPM_SLACK_S = 0.005
#: Each GPU's PCIe throughput is read about this often (each read blocks 2 x 20 ms).
PCIE_PERIOD_S = 1.0

#: GPM metric ids (``pynvml.NVML_GPM_METRIC_*``), in the order the sampler asks for them.
GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_ANY_TENSOR_UTIL, GPM_DRAM_BW_UTIL = 2, 3, 5, 10
GPM_METRICS = (GPM_DRAM_BW_UTIL, GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_ANY_TENSOR_UTIL)

COLUMNS = tuple(c.name for c in GPU.columns)


class NvmlApi(Protocol):
    """The NVML reads the sampler makes, by GPU index, in NVML's own units.

    Every method may raise ``pynvml.NVMLError`` (or a subclass); the wrapper
    decides what each error means.
    """

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def device_count(self) -> int: ...
    def name(self, gpu: int) -> str: ...
    def utilization(self, gpu: int) -> tuple[float, float]:
        """(utilization.gpu %, utilization.memory %)."""
        ...
    def memory_used_bytes(self, gpu: int) -> int: ...
    def power_mw(self, gpu: int) -> int: ...
    def clock_mhz(self, gpu: int, clock: str) -> int:
        """``clock`` is ``"sm"`` or ``"mem"``."""
        ...
    def clock_event_reasons(self, gpu: int) -> int: ...
    def pcie_kib_per_s(self, gpu: int, direction: str) -> int:
        """``direction`` is ``"tx"`` or ``"rx"``; blocks about 20 ms on real hardware."""
        ...
    def gpm_supported(self, gpu: int) -> bool: ...
    def gpm_sample(self, gpu: int, buffer: Any | None) -> Any:
        """Fill ``buffer`` (allocated when None) with a GPM sample; return it."""
        ...
    def gpm_metrics(self, first: Any, second: Any, metric_ids: Sequence[int]) -> list[float | None]:
        """Metrics between two samples; None for a metric NVML could not compute."""
        ...
    def gpm_free(self, buffer: Any) -> None: ...


class PynvmlApi:
    """:class:`NvmlApi` over the real ``pynvml`` (nvidia-ml-py), imported on first use."""

    def __init__(self) -> None:
        import pynvml

        self._n = pynvml
        self._handles: dict[int, Any] = {}

    def _h(self, gpu: int) -> Any:
        h = self._handles.get(gpu)
        if h is None:
            h = self._handles[gpu] = self._n.nvmlDeviceGetHandleByIndex(gpu)
        return h

    def init(self) -> None:
        self._n.nvmlInit()

    def shutdown(self) -> None:
        self._handles.clear()
        self._n.nvmlShutdown()

    def device_count(self) -> int:
        return int(self._n.nvmlDeviceGetCount())

    def name(self, gpu: int) -> str:
        name = self._n.nvmlDeviceGetName(self._h(gpu))
        return name.decode() if isinstance(name, bytes) else str(name)

    def utilization(self, gpu: int) -> tuple[float, float]:
        u = self._n.nvmlDeviceGetUtilizationRates(self._h(gpu))
        return float(u.gpu), float(u.memory)

    def memory_used_bytes(self, gpu: int) -> int:
        return int(self._n.nvmlDeviceGetMemoryInfo(self._h(gpu)).used)

    def power_mw(self, gpu: int) -> int:
        return int(self._n.nvmlDeviceGetPowerUsage(self._h(gpu)))

    def clock_mhz(self, gpu: int, clock: str) -> int:
        kind = self._n.NVML_CLOCK_SM if clock == "sm" else self._n.NVML_CLOCK_MEM
        return int(self._n.nvmlDeviceGetClockInfo(self._h(gpu), kind))

    def clock_event_reasons(self, gpu: int) -> int:
        try:
            return int(self._n.nvmlDeviceGetCurrentClocksEventReasons(self._h(gpu)))
        except self._n.NVMLError_FunctionNotFound:  # drivers before 535 name it "throttle"
            return int(self._n.nvmlDeviceGetCurrentClocksThrottleReasons(self._h(gpu)))

    def pcie_kib_per_s(self, gpu: int, direction: str) -> int:
        counter = self._n.NVML_PCIE_UTIL_TX_BYTES if direction == "tx" else self._n.NVML_PCIE_UTIL_RX_BYTES
        return int(self._n.nvmlDeviceGetPcieThroughput(self._h(gpu), counter))

    def gpm_supported(self, gpu: int) -> bool:
        return bool(self._n.nvmlGpmQueryDeviceSupport(self._h(gpu)).isSupportedDevice)

    def gpm_sample(self, gpu: int, buffer: Any | None) -> Any:
        if buffer is None:
            buffer = self._n.nvmlGpmSampleAlloc()
        self._n.nvmlGpmSampleGet(self._h(gpu), buffer)
        return buffer

    def gpm_metrics(self, first: Any, second: Any, metric_ids: Sequence[int]) -> list[float | None]:
        n = self._n
        req = n.c_nvmlGpmMetricsGet_t()
        req.version = n.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(metric_ids)
        req.sample1 = first
        req.sample2 = second
        for i, mid in enumerate(metric_ids):
            req.metrics[i].metricId = mid
        n.nvmlGpmMetricsGet(req)
        return [float(req.metrics[i].value) if req.metrics[i].nvmlReturn == n.NVML_SUCCESS else None
                for i in range(len(metric_ids))]

    def gpm_free(self, buffer: Any) -> None:
        self._n.nvmlGpmSampleFree(buffer)


class GpuLost(Exception):
    """NVML says the GPU fell off the bus (``NVMLError_GpuIsLost``), or NVML itself went away
    (``nvml_gone``: the driver unloaded, NVML shut down, a library/driver mismatch after an upgrade)."""

    def __init__(self, why: str, nvml_gone: bool = False) -> None:
        super().__init__(why)
        self.nvml_gone = nvml_gone


def _error_classes() -> tuple[type[BaseException], tuple[type[BaseException], ...], type[BaseException],
                              tuple[type[BaseException], ...]]:
    """(NVMLError, the 'unsupported' errors, GpuIsLost, the 'NVML is gone' errors), from pynvml itself."""
    import pynvml

    unsupported = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound,
                   pynvml.NVMLError_NoPermission)
    gone = (pynvml.NVMLError_DriverNotLoaded, pynvml.NVMLError_Uninitialized,
            pynvml.NVMLError_LibRmVersionMismatch, pynvml.NVMLError_LibraryNotFound)
    return pynvml.NVMLError, unsupported, pynvml.NVMLError_GpuIsLost, gone


class Nvml:
    """The one NVML wrapper: lazy init, a null for an unsupported field, "unsupported" said once.

    Args:
        api: the NVML surface (default: real ``pynvml``).
        note: where degradations are written down (``meta.json`` notes).
    """

    def __init__(self, api: NvmlApi | None = None, note: Callable[[str], None] | None = None) -> None:
        self._api = api
        self._note = note or (lambda _text: None)
        self._ready: bool | None = None
        self.reason: str | None = None
        self._unsupported: set[tuple[int, str]] = set()
        self.read_errors = 0
        self._errors = _error_classes()

    @property
    def api(self) -> NvmlApi:
        assert self._api is not None
        return self._api

    def available(self) -> bool:
        """Initialise NVML on first use; False (with :attr:`reason`) when there is no driver or GPU."""
        if self._ready is None:
            try:
                if self._api is None:
                    self._api = PynvmlApi()
                self._api.init()
                count = self._api.device_count()
                self._ready = count > 0
                if not count:
                    self.reason = "NVML reports no GPU"
            except Exception as e:  # no library, no driver, driver/library mismatch...
                self._ready = False
                self.reason = f"NVML unavailable ({type(e).__name__}: {e})"
        return self._ready

    def shutdown(self) -> None:
        if self._ready and self._api is not None:
            try:
                self._api.shutdown()
            except Exception:
                pass
        self._ready = None

    def supported(self, gpu: int, field: str) -> bool:
        return (gpu, field) not in self._unsupported

    def mark_unsupported(self, gpu: int, field: str, why: str) -> None:
        if (gpu, field) in self._unsupported:
            return
        self._unsupported.add((gpu, field))
        msg = f"NVML: {field} not supported on GPU {gpu} ({why}); its column stays null"
        say_once(f"nvml-unsupported-{field}", msg + " (said once)")
        self._note(msg)

    def read(self, gpu: int, field: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or None when the field is unsupported or the read failed once.

        Raises :class:`GpuLost` when NVML says the GPU is gone.
        """
        if (gpu, field) in self._unsupported:
            return None
        nvml_error, unsupported, lost, gone = self._errors
        try:
            return fn(*args)
        except lost as e:
            raise GpuLost(str(e)) from e
        except gone as e:  # every later read fails the same way: not a transient error
            raise GpuLost(f"{type(e).__name__}: {e}", nvml_gone=True) from e
        except unsupported as e:
            self.mark_unsupported(gpu, field, f"{type(e).__name__}: {e}")
        except nvml_error as e:
            self.read_errors += 1
            say_once(f"nvml-error-{field}", f"NVML error reading {field} on GPU {gpu} "
                     f"({type(e).__name__}: {e}); null for that sample, later errors are counted")
        return None


class NvmlSampler:
    """Samples every GPU at ``hz`` on a background thread into the ``gpu`` table.

    Use :func:`collectors.system.start_system_collectors` from a CLI, or as a
    context manager / :meth:`start` + :meth:`stop`. Without NVML (no driver, no
    GPU) :meth:`start` says so on one line, notes it in ``meta.json`` and does
    nothing else: no ``gpu`` table is created.

    Args:
        recorder: a :class:`collectors.Recorder` (anything with ``sink``, ``note``, ``writer``).
        hz: samples per second, 0 < hz <= 100.
        api: the NVML surface (tests pass a double; default real ``pynvml``).
        gpus: NVML indices to sample; default ``CUDA_VISIBLE_DEVICES`` when it lists indices, else all.
        clock: monotonic seconds, for the GPM window and PCIe turns (tests drive it by hand).
    """

    def __init__(self, recorder: Any, hz: float = DEFAULT_HZ, *, api: NvmlApi | None = None,
                 gpus: Sequence[int] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.hz = check_hz(hz)
        self._clock = clock
        self.recorder = recorder
        self.nvml = Nvml(api, note=recorder.note)
        self.gpus: list[int] = []
        self._wanted = list(gpus) if gpus is not None else _visible_devices()
        self._gpm: dict[int, bool] = {}
        self._gpm_prev: dict[int, tuple[float, Any]] = {}
        self._gpm_spare: dict[int, Any] = {}
        self._pcie_next: dict[int, float] = {}
        self._lost: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sink: Any = None
        self.samples = 0
        #: Periods the thread has gone through, sampled or switched off (``Recorder.enabled``).
        self.ticks = 0
        self.late_ticks = 0
        #: CPU time the sampler thread used, nanoseconds (read after :meth:`stop`).
        self.cpu_ns = 0
        self.running = False

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> NvmlSampler:
        """Find the GPUs, fill ``meta.json`` ``hardware``, start the thread. Never raises."""
        try:
            if not self._setup():
                return self
        except Exception as e:
            self.recorder.note(f"NVML sampler not started: {type(e).__name__}: {e}")
            say_once("nvml-setup", f"NVML sampler not started ({type(e).__name__}: {e}); "
                     "recording continues without GPU samples")
            return self
        self.running = True
        self._thread = threading.Thread(target=self._run, name="tracetool-nvml", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, free GPM buffers, shut NVML down. Idempotent; never raises."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._thread = None
        if self.running:
            self.running = False
            if self.nvml.read_errors:
                self.recorder.note(f"NVML: {self.nvml.read_errors} read error(s); those samples have nulls")
            for buf in [b for _, b in self._gpm_prev.values()] + list(self._gpm_spare.values()):
                try:
                    self.nvml.api.gpm_free(buf)
                except Exception:
                    pass
            self._gpm_prev.clear()
            self._gpm_spare.clear()
        self.nvml.shutdown()

    def __enter__(self) -> NvmlSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _setup(self) -> bool:
        nvml = self.nvml
        if not nvml.available():
            reason = nvml.reason or "NVML unavailable"
            say_once("nvml-unavailable", f"{reason}: no GPU samples (no gpu table); the rest is recorded")
            self.recorder.note(f"gpu: not recorded: {reason}")
            return False
        count = nvml.api.device_count()
        self.gpus = [i for i in (self._wanted if self._wanted is not None else range(count)) if 0 <= i < count]
        if not self.gpus:
            say_once("nvml-no-visible", "NVML: none of the requested GPUs exist; no GPU samples")
            self.recorder.note(f"gpu: not recorded: requested GPUs {self._wanted} not among {count}")
            return False
        self._fill_hardware()
        for gpu in self.gpus:
            supported = nvml.read(gpu, "gpm", nvml.api.gpm_supported, gpu)
            self._gpm[gpu] = bool(supported)
            if not supported:
                nvml.mark_unsupported(gpu, "GPM metrics", "needs Hopper or newer and a driver with GPM; "
                                      "dram_bw_util_pct, sm_occupancy_pct and tensor_util_pct stay null, "
                                      "sm_util_pct falls back to utilization.gpu")
        self._sink = self.recorder.sink("gpu")
        self.recorder.note(f"gpu: NVML sampled at {self.hz:g} Hz, GPUs {self.gpus}"
                           + (", GPM on" if any(self._gpm.values()) else ", GPM off"))
        return True

    def _fill_hardware(self) -> None:
        """``meta.json`` ``hardware`` from the device name; what the user set already wins."""
        api = self.nvml.api
        names = [self.nvml.read(g, "name", api.name, g) or "unknown" for g in self.gpus]
        first = names[0]
        count = sum(1 for n in names if n == first)
        preset = match_gpu_name(first)
        detected: dict[str, Any] = preset.hardware_meta(count) if preset else {"gpu": first, "gpu_count": count}
        detected["nvml_name"] = first
        if preset is None:
            self.recorder.note(f"hardware: GPU {first!r} has no preset; peak bandwidth and FLOP/s unknown "
                               "(pass them in meta hardware)")
        if len(set(names)) > 1:
            self.recorder.note(f"hardware: mixed GPUs {sorted(set(names))}; hardware describes {first!r}")
        writer = self.recorder.writer
        current = writer.meta.get("hardware")
        merged = dict(detected)
        if isinstance(current, dict):
            merged.update(current)
        writer.update_meta(hardware=merged)

    # -- sampling ------------------------------------------------------------------
    def _run(self) -> None:
        start_cpu = time.thread_time_ns()
        period = 1.0 / self.hz
        next_t = time.monotonic()
        try:
            while not self._stop.is_set() and self.gpus:
                if self.recorder.enabled:  # switched off (Recorder.enabled): no NVML calls, no rows
                    self.sample_once()
                self.ticks += 1
                next_t += period
                delay = next_t - time.monotonic()
                if delay < 0:  # fell behind (a slow NVML call): skip the missed ticks, never burst
                    self.late_ticks += 1
                    next_t = time.monotonic()
                    delay = 0.0
                if self._stop.wait(delay):
                    break
        except Exception as e:  # a bug here must not reach the host
            self.recorder.error("nvml sampler", e)
        finally:
            self.cpu_ns = time.thread_time_ns() - start_cpu

    def sample_once(self) -> None:
        """Read every sampled GPU once and append one row each (the thread's body)."""
        for gpu in list(self.gpus):
            try:
                row = self._read_gpu(gpu)
            except GpuLost as e:
                if e.nvml_gone:
                    self._nvml_gone(str(e))
                    return
                self._gpu_lost(gpu, str(e))
                continue
            self._sink.append(row)
            self.samples += 1

    def _gpu_lost(self, gpu: int, why: str) -> None:
        self.gpus.remove(gpu)
        self._lost.add(gpu)
        msg = (f"NVML: GPU {gpu} lost ({why}) at {time.time_ns()} ns; its sampling ended"
               + ("" if self.gpus else "; no GPU left, the NVML sampler stopped"))
        say_once(f"nvml-lost-{gpu}", msg)
        self.recorder.note(msg)
        self._gpm_prev.pop(gpu, None)

    def _nvml_gone(self, why: str) -> None:
        self._lost.update(self.gpus)
        self.gpus.clear()
        msg = (f"NVML went away ({why}) at {time.time_ns()} ns; no GPU left to sample, the NVML "
               "sampler stopped")
        say_once("nvml-gone", msg)
        self.recorder.note(msg)

    def _read_gpu(self, gpu: int) -> tuple[Any, ...]:
        nvml, api = self.nvml, self.nvml.api
        ts = time.time_ns()
        util = nvml.read(gpu, "utilization", api.utilization, gpu)
        gpu_util, mem_util = util if util is not None else (None, None)
        mem_used = nvml.read(gpu, "memory used", api.memory_used_bytes, gpu)
        power_mw = nvml.read(gpu, "power", api.power_mw, gpu)
        sm_clock = nvml.read(gpu, "SM clock", api.clock_mhz, gpu, "sm")
        mem_clock = nvml.read(gpu, "memory clock", api.clock_mhz, gpu, "mem")
        reasons = nvml.read(gpu, "clock-event reasons", api.clock_event_reasons, gpu)
        tx = rx = None
        now = self._clock()
        if now >= self._pcie_next.get(gpu, 0.0) and self._pcie_turn(gpu, now):
            self._pcie_next[gpu] = now + PCIE_PERIOD_S
            tx = nvml.read(gpu, "PCIe throughput", api.pcie_kib_per_s, gpu, "tx")
            rx = nvml.read(gpu, "PCIe throughput", api.pcie_kib_per_s, gpu, "rx")
        dram = sm = occ = tensor = None
        if self._gpm.get(gpu):
            dram, sm, occ, tensor = self._read_gpm(gpu)
        else:
            sm = gpu_util
        return (ts, gpu, sm, mem_util, dram, _scale(power_mw, 1e-3), _f(sm_clock), _f(mem_clock),
                mem_used, gpu_util, occ, tensor, reasons, _scale(tx, 1024.0), _scale(rx, 1024.0))

    def _pcie_turn(self, gpu: int, now: float) -> bool:
        """One GPU's PCIe read per tick at most: the GPU whose turn is oldest goes."""
        due = [g for g in self.gpus if now >= self._pcie_next.get(g, 0.0)]
        return bool(due) and min(due, key=lambda g: (self._pcie_next.get(g, 0.0), g)) == gpu

    def _read_gpm(self, gpu: int) -> tuple[float | None, ...]:
        """GPM metrics over the window since the previous GPM sample, when it is long enough."""
        nvml, api = self.nvml, self.nvml.api
        nulls: tuple[float | None, ...] = (None, None, None, None)
        now = self._clock()
        prev = self._gpm_prev.get(gpu)
        if prev is not None and now - prev[0] < GPM_MIN_WINDOW_S - _GPM_SLACK_S:
            return nulls
        spare = self._gpm_spare.pop(gpu, None)
        buf = nvml.read(gpu, "GPM metrics", api.gpm_sample, gpu, spare)
        if buf is None:
            if spare is not None:
                self._gpm_spare[gpu] = spare
            self._gpm[gpu] = nvml.supported(gpu, "GPM metrics")
            return nulls
        self._gpm_prev[gpu] = (now, buf)
        if prev is None:
            return nulls
        self._gpm_spare[gpu] = prev[1]  # two buffers per GPU, used in turn
        values = nvml.read(gpu, "GPM metrics", api.gpm_metrics, prev[1], buf, GPM_METRICS)
        if values is None:
            self._gpm[gpu] = nvml.supported(gpu, "GPM metrics")
            return nulls
        return tuple(values)


def check_hz(hz: float, *, what: str = "--nvml", max_hz: float = MAX_HZ) -> float:
    """A sampling rate in (0, max_hz], or a :class:`UsageError` naming the flag."""
    try:
        value = float(hz)
    except (TypeError, ValueError):
        raise UsageError(f"{what}: rate must be a number of samples per second, got {hz!r}") from None
    if not 0 < value <= max_hz:
        raise UsageError(f"{what}: rate must be > 0 and <= {max_hz:g} Hz, got {hz!r}")
    return value


def _visible_devices() -> list[int] | None:
    """NVML indices named by ``CUDA_VISIBLE_DEVICES`` when it lists plain indices (not UUIDs)."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None or not raw.strip():
        return None
    try:
        return [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        return None


def _f(v: Any) -> float | None:
    return None if v is None else float(v)


def _scale(v: Any, k: float) -> float | None:
    return None if v is None else float(v) * k
