"""NVML sampler: values land in the gpu table in the right units; every NVML failure degrades.

Driven by the scripted double (tests/system/nvml_double.py) through the same
NvmlApi seam the real pynvml backend uses; the errors are pynvml's own classes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
from nvml_double import GpuScript, ScriptedNvml

from collectors import Recorder
from collectors.nvml import Nvml, NvmlSampler, PynvmlApi
from collectors.system import start_system_collectors
from tests.waiting import wait_until
from tracetool import notices
from tracetool.errors import UsageError
from tracetool.reader import open_trace


@pytest.fixture(autouse=True)
def _fresh_notices() -> None:
    notices.reset()


class Clock:
    """A monotonic clock the test moves by hand (GPM windows and PCIe turns use it)."""

    def __init__(self, step: float) -> None:
        self.t = 1000.0
        self.step = step

    def __call__(self) -> float:
        return self.t

    def tick(self) -> None:
        self.t += self.step


def run_samples(tmp_path: Path, api: ScriptedNvml, n: int, *, step: float = 0.1, hz: float = 10,
                gpus: list[int] | None = None) -> tuple[Any, NvmlSampler]:
    """Start a sampler without its thread, take ``n`` samples by hand, close, read back."""
    clock = Clock(step)
    rec = Recorder(tmp_path / "trace").start()
    sampler = NvmlSampler(rec, hz, api=api, gpus=gpus, clock=clock)
    assert sampler._setup()
    sampler.running = True
    for _ in range(n):
        sampler.sample_once()
        clock.tick()
    sampler.stop()
    rec.close()
    return open_trace(tmp_path / "trace", strict=True), sampler


def rows(trace: Any, gpu: int | None = None) -> list[dict[str, Any]]:
    out = trace.table("gpu").to_pylist()
    return [r for r in out if gpu is None or r["gpu"] == gpu]


def stderr_lines(capsys: pytest.CaptureFixture[str], needle: str) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if needle in ln]


def test_values_land_in_the_gpu_table_in_schema_units(tmp_path: Path) -> None:
    plain = GpuScript(name="NVIDIA A100-SXM4-80GB", gpm_supported=False)
    api = ScriptedNvml([GpuScript(), plain])
    trace, _ = run_samples(tmp_path, api, 4)
    h100 = rows(trace, 0)
    assert len(h100) == 4 and len(rows(trace, 1)) == 4
    last = h100[-1]
    assert last["power_w"] == pytest.approx(612.345)            # NVML milliwatts -> watts
    assert last["mem_used_bytes"] == 71_000_000_000
    assert last["sm_clock_mhz"] == 1980 and last["mem_clock_mhz"] == 2619
    assert last["gpu_util_pct"] == 97.0 and last["mem_util_pct"] == 81.0
    assert last["clock_event_reasons"] == 1
    # GPM (Hopper): every row after the first closes a >= 100 ms window
    assert h100[0]["dram_bw_util_pct"] is None
    assert [r["dram_bw_util_pct"] for r in h100[1:]] == [83.5] * 3
    assert last["sm_util_pct"] == 91.0 and last["sm_occupancy_pct"] == 44.0 and last["tensor_util_pct"] == 12.5
    # PCIe: KiB/s -> bytes/s, read for one GPU per tick, each GPU about once a second
    pcie = [(r["gpu"], r["pcie_tx_bytes_per_s"], r["pcie_rx_bytes_per_s"]) for r in rows(trace)
            if r["pcie_tx_bytes_per_s"] is not None]
    assert pcie[:2] == [(0, 2048 * 1024.0, 4096 * 1024.0), (1, 2048 * 1024.0, 4096 * 1024.0)]
    # no GPM on the A100: sm_util_pct is utilization.gpu, GPM columns null
    a100 = rows(trace, 1)
    assert all(r["sm_util_pct"] == r["gpu_util_pct"] == 97.0 for r in a100)
    assert all(r["dram_bw_util_pct"] is None and r["tensor_util_pct"] is None for r in a100)
    ts = [r["ts_ns"] for r in h100]
    assert ts == sorted(ts) and ts[0] > 1_600_000_000 * 10**9   # server clock: unix ns
    hw = trace.meta["hardware"]
    assert hw["preset"] == "h100-sxm" and hw["gpu_count"] == 1 and hw["mem_bw_bytes_per_s"] == 3.35e12
    assert hw["nvml_name"] == "NVIDIA H100 80GB HBM3"
    assert any("mixed GPUs" in n for n in trace.meta["notes"])


def test_gpm_values_only_on_rows_that_close_a_100ms_window(tmp_path: Path) -> None:
    trace, _ = run_samples(tmp_path, ScriptedNvml(), 25, step=0.01, hz=100)
    dram = [r["dram_bw_util_pct"] for r in rows(trace)]
    filled = [i for i, v in enumerate(dram) if v is not None]
    assert len(dram) == 25 and filled == [10, 20]          # windows of GPM_MIN_WINDOW_S at 100 Hz


def test_gpm_buffers_are_freed(tmp_path: Path) -> None:
    api = ScriptedNvml([GpuScript(), GpuScript()])
    run_samples(tmp_path, api, 5)
    assert api.allocated == 4 and api.freed == 4 and api.shut_down


@pytest.mark.parametrize(("field", "error", "column"), [
    ("power_mw", pynvml.NVMLError_NotSupported, "power_w"),
    ("clock_event_reasons", pynvml.NVMLError_FunctionNotFound, "clock_event_reasons"),
    ("pcie_tx", pynvml.NVMLError_NotSupported, "pcie_tx_bytes_per_s"),
    ("memory_used_bytes", pynvml.NVMLError_NoPermission, "mem_used_bytes"),
])
def test_an_unsupported_field_is_null_with_one_note_and_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, error: type, column: str) -> None:
    gpus = [GpuScript(), GpuScript()]
    for g in gpus:
        g.readings[field] = [error]
    api = ScriptedNvml(gpus)
    trace, _ = run_samples(tmp_path, api, 12)
    assert all(r[column] is None for r in rows(trace))
    assert all(r["sm_clock_mhz"] == 1980 for r in rows(trace))      # the other fields still arrive
    notes = [n for n in trace.meta["notes"] if "not supported" in n]
    assert len(notes) == 2 and all(type(error()).__name__ in n for n in notes)  # once per GPU
    assert len(stderr_lines(capsys, "not supported")) == 1                    # said once
    assert api.calls[(0, field)] == 1                                          # and never asked again


def test_gpm_not_supported_falls_back_and_notes_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api = ScriptedNvml([GpuScript(gpm_supported=pynvml.NVMLError_FunctionNotFound)])
    trace, _ = run_samples(tmp_path, api, 3)
    assert all(r["dram_bw_util_pct"] is None and r["sm_occupancy_pct"] is None for r in rows(trace))
    assert all(r["sm_util_pct"] == 97.0 for r in rows(trace))
    assert sum("GPM" in n for n in trace.meta["notes"] if "not supported" in n) == 1
    assert len(stderr_lines(capsys, "GPM")) == 1


def test_gpm_failing_mid_run_degrades_to_utilization(tmp_path: Path) -> None:
    script = GpuScript()
    script.readings["gpm"] = [{10: 80.0, 2: 90.0, 3: 40.0, 5: 10.0}, pynvml.NVMLError_NotSupported]
    trace, _ = run_samples(tmp_path, ScriptedNvml([script]), 5)
    dram = [r["dram_bw_util_pct"] for r in rows(trace)]
    sm = [r["sm_util_pct"] for r in rows(trace)]
    assert dram == [None, 80.0, None, None, None]
    assert sm == [None, 90.0, None, 97.0, 97.0]   # GPM row, the failed window, then utilization.gpu


def test_a_transient_error_nulls_one_sample_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = GpuScript()
    script.readings["power_mw"] = [100_000, pynvml.NVMLError_Unknown, 200_000]
    trace, sampler = run_samples(tmp_path, ScriptedNvml([script]), 4)
    assert [r["power_w"] for r in rows(trace)] == [100.0, None, 200.0, 200.0]
    assert sampler.nvml.read_errors == 1
    assert any("1 read error" in n for n in trace.meta["notes"])
    assert len(stderr_lines(capsys, "NVML error reading power")) == 1


def test_gpu_lost_mid_run_ends_its_sampling_with_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lost = GpuScript()
    lost.readings["utilization"] = [(50.0, 40.0)] * 3 + [pynvml.NVMLError_GpuIsLost]
    api = ScriptedNvml([lost, GpuScript()])
    trace, sampler = run_samples(tmp_path, api, 6)
    assert len(rows(trace, 0)) == 3 and len(rows(trace, 1)) == 6
    assert sampler.gpus == [1]
    assert any("GPU 0 lost" in n for n in trace.meta["notes"])
    assert len(stderr_lines(capsys, "GPU 0 lost")) == 1


def test_losing_the_last_gpu_stops_the_thread(tmp_path: Path) -> None:
    script = GpuScript()
    script.readings["power_mw"] = [300_000, 300_000, pynvml.NVMLError_GpuIsLost]
    api = ScriptedNvml([script])
    rec = Recorder(tmp_path / "t").start()
    sampler = NvmlSampler(rec, 100, api=api).start()
    assert sampler._thread is not None
    sampler._thread.join(timeout=10)                     # ends by itself: nothing left to sample
    assert not sampler._thread.is_alive()
    rec.close()
    trace = open_trace(tmp_path / "t", strict=True)
    assert trace.rows("gpu") == 2
    assert any("no GPU left" in n for n in trace.meta["notes"])


def test_the_thread_samples_at_its_rate_and_stops_on_close(tmp_path: Path) -> None:
    api = ScriptedNvml()
    rec = Recorder(tmp_path / "t").start()
    handle = start_system_collectors(rec, nvml_hz=50, nvml_api=api)
    assert api.wait_samples(5)
    rec.close()                                          # on_close stops the sampler first
    assert handle.nvml is not None and not handle.nvml.running
    trace = open_trace(tmp_path / "t", strict=True)
    assert trace.rows("gpu") >= 5 and trace.rows("gpu") == handle.nvml.samples
    assert any("NVML sampled at 50 Hz" in n for n in trace.meta["notes"])
    assert handle.nvml.cpu_ns > 0


def test_recording_switched_off_pauses_sampling(tmp_path: Path) -> None:
    """``Recorder.enabled = False`` stops the NVML reads and the rows, on resumes both."""
    api = ScriptedNvml()
    rec = Recorder(tmp_path / "t").start()
    handle = start_system_collectors(rec, nvml_hz=100, nvml_api=api)
    assert api.wait_samples(3)
    sampler = handle.nvml
    assert sampler is not None
    rec.enabled = False
    tick = sampler.ticks                                 # a tick already past its check may still land
    wait_until(lambda: sampler.ticks >= tick + 2, "the tick under way to end")
    off_ns, reads, tick = time.time_ns(), api.samples_read, sampler.ticks
    wait_until(lambda: sampler.ticks >= tick + 20, "20 ticks switched off")
    assert api.samples_read == reads
    on_ns = time.time_ns()
    rec.enabled = True
    assert api.wait_samples(reads + 3)
    rec.close()
    trace = open_trace(tmp_path / "t", strict=True)
    ts = [r["ts_ns"] for r in rows(trace)]
    assert not [t for t in ts if off_ns <= t < on_ns]
    assert any(t >= on_ns for t in ts) and any(t < off_ns for t in ts)
    assert handle.nvml is not None and len(ts) == handle.nvml.samples


def test_no_driver_one_line_no_gpu_table_rest_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api = ScriptedNvml(init_error=pynvml.NVMLError_DriverNotLoaded)
    rec = Recorder(tmp_path / "t").start()
    start_system_collectors(rec, nvml_hz=10, nvml_api=api)
    with rec.request("r1", prompt_tokens=3) as req, req.span("decode"):
        req.token(0, kv_len=3)
    rec.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Driver Not Loaded" in err[0] and "no gpu table" in err[0]
    trace = open_trace(tmp_path / "t", strict=True)
    assert not trace.has("gpu") and not (tmp_path / "t" / "gpu.arrows").exists()
    assert trace.rows("tokens") == 1 and trace.rows("spans") == 1
    assert any("gpu: not recorded" in n for n in trace.meta["notes"])


def test_user_hardware_meta_wins_over_detection(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "t", meta={"hardware": {"gpu": "H100 SXM", "gpu_count": 2}}).start()
    NvmlSampler(rec, 10, api=ScriptedNvml([GpuScript(name="NVIDIA H200")])).start().stop()
    rec.close()
    hw = json.loads((tmp_path / "t" / "meta.json").read_text())["hardware"]
    assert hw["gpu"] == "H100 SXM" and hw["gpu_count"] == 2         # the user's
    assert hw["mem_bw_bytes_per_s"] == 4.8e12 and hw["nvml_name"] == "NVIDIA H200"  # filled in


def test_unknown_gpu_name_keeps_name_and_count(tmp_path: Path) -> None:
    trace, _ = run_samples(tmp_path, ScriptedNvml([GpuScript(name="Quadro Mystery 9000")]), 1)
    assert trace.meta["hardware"] == {"gpu": "Quadro Mystery 9000", "gpu_count": 1,
                                      "nvml_name": "Quadro Mystery 9000"}
    assert any("no preset" in n for n in trace.meta["notes"])


@pytest.mark.parametrize("hz", [0, -1, 101, "fast"])
def test_rates_out_of_range_are_usage_errors(tmp_path: Path, hz: Any) -> None:
    rec = Recorder(tmp_path / "t").start()
    with pytest.raises(UsageError, match="--nvml"):
        start_system_collectors(rec, nvml_hz=hz, nvml_api=ScriptedNvml())
    rec.close()


def test_real_nvml_on_this_machine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real pynvml path: without a driver one line and no gpu table; with one, real rows."""
    probe = Nvml(PynvmlApi())
    has_gpu = probe.available()
    probe.shutdown()
    notices.reset()
    rec = Recorder(tmp_path / "t").start()
    handle = start_system_collectors(rec, nvml_hz=20)
    with rec.request("r1") as req:
        req.token(0)
    rec.close()
    trace = open_trace(tmp_path / "t", strict=True)
    assert trace.rows("tokens") == 1
    if has_gpu:
        assert handle.nvml is not None and trace.rows("gpu") >= 1
        assert trace.meta["hardware"]["gpu_count"] >= 1
    else:
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith("tracetool: NVML unavailable")
        assert not trace.has("gpu") and "hardware" not in trace.meta
        assert sum("gpu: not recorded" in n for n in trace.meta["notes"]) == 1


@pytest.mark.gpu
def test_real_gpu_rows_have_power_and_clocks(tmp_path: Path) -> None:
    probe = Nvml(PynvmlApi())
    if not probe.available():
        pytest.skip(f"needs an NVIDIA GPU and driver: {probe.reason}")
    probe.shutdown()
    rec = Recorder(tmp_path / "t").start()
    sampler = NvmlSampler(rec, 20, gpus=[0]).start()
    wait_until(lambda: sampler.samples >= 5 or not sampler.running, "5 samples of the real GPU")
    sampler.stop()
    rec.close()
    got = open_trace(tmp_path / "t").table("gpu").to_pylist()
    assert len(got) >= 5
    assert all(r["power_w"] is None or 1 < r["power_w"] < 2000 for r in got)
    assert any(r["sm_clock_mhz"] for r in got)


def test_pynvml_adapter_speaks_pynvml_structs(monkeypatch: pytest.MonkeyPatch) -> None:
    """PynvmlApi against pynvml's own ctypes structs, with only the C entry points replaced.

    Without a GPU this is the closest check of the real adapter: field names,
    the GPM request struct, per-metric return codes, the throttle-reasons fallback.
    """
    calls: list[str] = []
    handle = object()

    def metrics_get(req: Any) -> Any:
        calls.append(f"metrics v{req.version} n{req.numMetrics}")
        assert bool(req.sample1) and bool(req.sample2)           # real sample pointers were passed
        for i in range(req.numMetrics):
            m = req.metrics[i]
            m.value = {10: 81.5, 2: 90.0, 3: 40.0}.get(m.metricId, 0.0)
            m.nvmlReturn = pynvml.NVML_SUCCESS if m.metricId != 5 else pynvml.NVML_ERROR_NOT_SUPPORTED
        return req

    def event_reasons(h: Any) -> int:
        raise pynvml.NVMLError_FunctionNotFound()

    fakes = {
        "nvmlInit": lambda: calls.append("init"),
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: handle,
        "nvmlDeviceGetName": lambda h: b"NVIDIA H200",
        "nvmlDeviceGetUtilizationRates": lambda h: pynvml.c_nvmlUtilization_t(gpu=88, memory=66),
        "nvmlDeviceGetMemoryInfo": lambda h: pynvml.c_nvmlMemory_t(total=10, free=3, used=7),
        "nvmlDeviceGetPowerUsage": lambda h: 450_000,
        "nvmlDeviceGetClockInfo": lambda h, kind: {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619}[kind],
        "nvmlDeviceGetCurrentClocksEventReasons": event_reasons,
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: 0x4,
        "nvmlDeviceGetPcieThroughput": lambda h, c: {pynvml.NVML_PCIE_UTIL_TX_BYTES: 11,
                                                     pynvml.NVML_PCIE_UTIL_RX_BYTES: 22}[c],
        "nvmlGpmQueryDeviceSupport": lambda h: pynvml.c_nvmlGpmSupport_t(version=1, isSupportedDevice=1),
        "nvmlGpmSampleAlloc": lambda: pynvml.c_nvmlGpmSample_t(pynvml.struct_c_nvmlGpmSample_t()),
        "nvmlGpmSampleGet": lambda h, s: s,
        "nvmlGpmMetricsGet": metrics_get,
    }
    for name, fn in fakes.items():
        monkeypatch.setattr(pynvml, name, fn)
    api = PynvmlApi()
    api.init()
    assert (api.device_count(), api.name(0)) == (1, "NVIDIA H200")
    assert api.utilization(0) == (88.0, 66.0) and api.memory_used_bytes(0) == 7
    assert (api.power_mw(0), api.clock_mhz(0, "sm"), api.clock_mhz(0, "mem")) == (450_000, 1980, 2619)
    assert api.clock_event_reasons(0) == 0x4                      # fell back to the pre-535 name
    assert (api.pcie_kib_per_s(0, "tx"), api.pcie_kib_per_s(0, "rx")) == (11, 22)
    assert api.gpm_supported(0)
    first, second = api.gpm_sample(0, None), api.gpm_sample(0, None)
    assert api.gpm_metrics(first, second, (10, 2, 3, 5)) == [81.5, 90.0, 40.0, None]
    assert calls == ["init", f"metrics v{pynvml.NVML_GPM_METRICS_GET_VERSION} n4"]
