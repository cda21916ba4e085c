"""scripts/gpu_check.py: its code path on CPU, its refusal without a GPU, its figures on a known trace."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from collectors import Recorder
from tracetool.presets import gpu_preset, model_preset

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=240,
                          cwd=REPO)


@pytest.mark.slow
def test_cpu_tiny_run_exercises_the_whole_path(tmp_path: Path) -> None:
    from tracetool.reader import open_trace

    r = run_script("--device", "cpu", "--tiny", "--out", str(tmp_path / "trace"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines if ln.startswith(("context", "verdict"))] == \
        ["context    128", "verdict    128", "context    512", "verdict    512"]
    assert any(ln.startswith("analyzer: ") for ln in lines)
    trace = open_trace(tmp_path / "trace", strict=True)
    assert trace.rows("tokens") == 16 and trace.meta["model"]["layers"] == 2
    assert "traceback" not in r.stderr.lower()


def test_without_a_gpu_it_fails_in_one_line_with_exit_2() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the refusal path does not apply")
    r = run_script()
    assert r.returncode == 2
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("gpu_check: cannot run here: no CUDA GPU")
    assert r.stdout == ""


def test_figures_from_a_known_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ITL, roofline ideal, efficiency, GPM DRAM utilisation and verdict, computed from rows we wrote."""
    h100, llama = gpu_preset("h100-sxm"), model_preset("llama-3.2-1b")
    rec = Recorder(tmp_path / "t", meta={"model": llama.model_meta(), "hardware": h100.hardware_meta(1)}).start()
    t0 = 1_700_000_000_000_000_000
    ms = 1_000_000
    rec.add_span("decode", t0, t0 + 100 * ms, request_id="ctx4096")
    for i in range(11):                                  # tokens every 10 ms, kv 4096..4106
        rec.token(i, kv_len=4096 + i, emit_ns=t0 + i * 10 * ms, request_id="ctx4096")
    gpu = rec.sink("gpu")
    for k, dram in enumerate([4.0, 6.0, 90.0]):         # the 90 % row is outside the decode span
        gpu.append((t0 + (40 + 50 * k) * ms, 0, None, None, dram, None, None, None, None, None, None, None,
                    None, None, None))
    rec.close()
    gc = load_script()
    gc.analyzer = lambda _path: None                     # the analyzer CLI is tested where it is built
    gc.report(tmp_path / "t", [4096])
    out = capsys.readouterr().out
    ideal_ms = (llama.weight_bytes_read() + 4101.5 * llama.kv_bytes_per_token()) / 3.35e12 * 1e3
    assert "ITL p50 10.00 ms" in out
    assert f"roofline ideal {ideal_ms:.3f} ms" in out
    assert f"bandwidth efficiency {ideal_ms / 10:.0%}" in out
    assert "GPM DRAM BW util during decode 5.0% (2 samples)" in out
    assert "verdict   4096: host/launch-bound" in out


@pytest.mark.parametrize(("eff", "dram", "start"), [
    (0.72, 81.0, "memory-bandwidth-bound"),
    (0.10, 5.0, "host/launch-bound"),
    (0.30, None, "below the roofline"),
    (None, None, "no roofline"),
])
def test_verdicts(eff: float | None, dram: float | None, start: str) -> None:
    assert load_script().verdict(eff, dram).startswith(start)


def test_analyzer_output_is_reported_whatever_its_shape() -> None:
    gc = load_script()
    assert gc.find_verdicts({"requests": [{"verdict": "decode dominates"}], "n": 1}) == \
        ["requests[0].verdict: decode dominates"]
    assert gc.find_verdicts({"share": {"decode": 0.9}}) == []
