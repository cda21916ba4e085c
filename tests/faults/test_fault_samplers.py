"""System samplers whose source disappears mid-run: py-spy killed, NVML gone.

``tests/system/test_nvml_sampler.py`` covers a GPU lost (``GpuIsLost``), a
transient error and an unsupported field; here NVML itself goes away under
a running sampler thread (driver unloaded, library mismatch after an
upgrade, NVML shut down under us), and the py-spy child is killed. Each
time: the host keeps running, the sampler ends with one line on stderr and
a note, and the rows sampled before stay in a valid trace.

The NVML source is the scripted double of ``tests/system/nvml_double.py``
(pynvml's own error classes), never presented as real readings.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest

from collectors import Recorder
from collectors.nvml import NvmlSampler
from collectors.pyspy import PySpySampler, pyspy_binary
from tests.system.nvml_double import H100_READINGS, GpuScript, ScriptedNvml
from tests.waiting import wait_until
from tracetool.reader import open_trace


@pytest.mark.parametrize("error", [pynvml.NVMLError_DriverNotLoaded, pynvml.NVMLError_Uninitialized,
                                   pynvml.NVMLError_LibRmVersionMismatch, pynvml.NVMLError_LibraryNotFound])
def test_nvml_gone_mid_run_ends_sampling_with_one_line(error: type[Exception], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    readings = {k: list(v) for k, v in H100_READINGS.items()}
    readings["utilization"] = [(97.0, 81.0)] * 5 + [error]  # the 6th sample finds NVML gone
    api = ScriptedNvml([GpuScript(readings=readings), GpuScript(readings={**readings})])
    rec = Recorder(tmp_path / "t").start()
    sampler = NvmlSampler(rec, 100.0, api=api).start()
    assert sampler._thread is not None
    sampler._thread.join(timeout=30)  # the thread ends by itself: no GPU left to sample
    assert not sampler._thread.is_alive(), "the sampler kept polling a gone NVML"
    sampler.stop()
    rec.close()
    t = open_trace(tmp_path / "t", strict=True)
    gpu = t.table("gpu").to_pylist()
    assert len(gpu) == 2 * 5 and all(r["gpu_util_pct"] == 97.0 for r in gpu)  # no null rows after it went
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "NVML" in ln]
    assert 1 <= len(lines) <= 2 and all(error.__name__ in ln or "gone" in ln for ln in lines), err
    assert any("no GPU left" in n for n in t.meta["notes"]), t.meta["notes"]
    assert rec.errors == 0  # a degradation, not a collector bug


BUSY = "import time\nwhile True:\n    sum(range(2000))\n"


@pytest.mark.slow
@pytest.mark.skipif(pyspy_binary() is None, reason="py-spy is not installed")
def test_pyspy_killed_mid_run_keeps_earlier_samples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        rec = Recorder(tmp_path / "t").start()
        sampler = PySpySampler(rec, host.pid, 50, segment_s=0.5).start()
        wait_until(lambda: sampler.rows > 0, "a segment collected", timeout=60)  # no event says "a segment landed"
        def live() -> Any:  # the py-spy sampling now (the next one attaches after each segment)
            seg = sampler._seg
            return seg if seg is not None and seg.started.is_set() and not seg.ended.is_set() else None

        seg = wait_until(live, "py-spy sampling its next segment", timeout=60, interval=0.01)
        seg.proc.send_signal(signal.SIGKILL)
        assert sampler.wait(30), "the sampler did not end after py-spy died"
        assert host.poll() is None, "the host died with py-spy"
        rows_before = sampler.rows
        sampler.stop()
        rec.close()
    finally:
        host.kill()
        host.wait()
    t = open_trace(tmp_path / "t", strict=True)
    assert t.rows("stacks") == rows_before > 0
    reason = sampler.ended_reason or ""
    assert "killed" in reason and "CPU sampling ended" in reason, reason
    assert any(reason in n for n in t.meta["notes"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "py-spy" in ln]
    assert len(lines) == 1, lines
    assert rec.errors == 0


class Injected(RuntimeError):
    """The fault a test injects (never raised by the product)."""


def test_an_exception_in_the_nvml_sampler_is_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the sampler's own code (not an NVML error) ends its thread, counted; the host goes on."""
    api = ScriptedNvml()
    rec = Recorder(tmp_path / "t").start()
    sampler = NvmlSampler(rec, 100.0, api=api)

    def broken(gpu: int) -> Any:
        raise Injected("injected in the NVML sampler")

    monkeypatch.setattr(sampler, "_read_gpu", broken)
    sampler.start()
    assert sampler._thread is not None
    sampler._thread.join(timeout=30)
    assert not sampler._thread.is_alive()
    sampler.stop()
    rec.close()
    assert rec.errors == 1
    t = open_trace(tmp_path / "t", strict=True)
    assert "collector errors: 1" in " ".join(t.meta["notes"])


@pytest.mark.slow
@pytest.mark.skipif(pyspy_binary() is None, reason="py-spy is not installed")
def test_an_exception_in_the_pyspy_sampler_is_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import collectors.pyspy as pyspy

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise Injected("injected while turning py-spy output into rows")

    monkeypatch.setattr(pyspy, "stack_rows", broken)
    host = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        rec = Recorder(tmp_path / "t").start()
        sampler = PySpySampler(rec, host.pid, 50, segment_s=0.3).start()
        assert sampler.wait(60), "the sampler did not end after its own failure"
        assert host.poll() is None
        sampler.stop()
        rec.close()
    finally:
        host.kill()
        host.wait()
    assert rec.errors == 1
    t = open_trace(tmp_path / "t", strict=True)
    assert "collector errors: 1" in " ".join(t.meta["notes"])


def test_serve_stops_its_samplers_without_a_collector_error(tmp_path: Path) -> None:
    """Regression: serve called the SystemCollectors handle instead of its stop() (a TypeError, counted)."""
    import os

    from collectors.launcher import start_samplers

    rec = Recorder(tmp_path / "t").start()
    stops = start_samplers(rec, {"nvml": 10.0}, os.getpid())  # no NVML here: a handle that has nothing to stop
    assert len(stops) == 1
    for stop in stops:
        rec.guard(stop, where="sampler stop")
    rec.close()
    assert rec.errors == 0
