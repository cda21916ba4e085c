"""`tracetool record` end to end: real child Pythons, real signals, traces checked with `tracetool validate`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from collectors.launcher import NO_TORCH_NOTE, NOT_LOADED_NOTE, SAMPLERS, SamplerSpec, run_recording
from tracetool.reader import open_trace

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _sigint_default() -> None:
    """Ctrl-C as in a terminal: a background job of a non-interactive shell (how a CI runner may
    start pytest) inherits SIGINT ignored, and then Python never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def record(out: Path, *command: str, timeout: float = 240, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracetool", "record", "-o", str(out), "--", *command],
                          capture_output=True, text=True, timeout=timeout, preexec_fn=_sigint_default, **kw)


def validate(out: Path) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "tracetool", "validate", "--json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


@pytest.mark.slow
def test_a_plain_hf_script_is_traced_without_code_changes(tmp_path: Path) -> None:
    r = record(tmp_path / "t", sys.executable, str(SCRIPTS / "plain_hf.py"))
    assert r.returncode == 0, r.stderr
    assert "['the quick brown fox" in r.stdout  # the script's own stdout is untouched
    assert r.stderr.strip().splitlines()[-1].startswith(f"tracetool: wrote {tmp_path / 't'}: 2 requests, 16 tokens")
    assert validate(tmp_path / "t")["closed"] is True
    t = open_trace(tmp_path / "t")
    tokens = t.table("tokens").to_pylist()
    assert Counter(r["request_id"] for r in tokens) == {"gen1-0": 8, "gen1-1": 8}
    prompt = {r["request_id"]: r["prompt_tokens"] for r in t.table("requests").to_pylist()}
    assert all(r["kv_len"] == prompt[r["request_id"]] + r["index"] for r in tokens)
    names = Counter(s["name"] for s in t.table("spans").to_pylist())
    assert names == {"tokenize": 2, "prefill": 2, "decode": 2, "detokenize": 2, "server.request": 2}
    assert t.rows("steps") == 8 and t.meta["model"]["layers"] == 2


@pytest.mark.slow
def test_a_script_that_raises_still_writes_a_valid_trace(tmp_path: Path) -> None:
    r = record(tmp_path / "t", sys.executable, str(SCRIPTS / "plain_hf.py"), "raise")
    assert r.returncode == 1
    assert "RuntimeError: boom after generate" in r.stderr
    validate(tmp_path / "t")
    assert open_trace(tmp_path / "t").rows("tokens") == 16


@pytest.mark.slow
def test_ctrl_c_inside_generate_keeps_the_tokens_so_far_and_exits_130(tmp_path: Path) -> None:
    r = record(tmp_path / "t", sys.executable, str(SCRIPTS / "plain_hf.py"), "interrupt")
    assert r.returncode == 130
    assert "KeyboardInterrupt" in r.stderr
    assert validate(tmp_path / "t")["closed"] is True
    t = open_trace(tmp_path / "t")
    assert Counter(r["request_id"] for r in t.table("tokens").to_pylist()) == {"gen1-0": 3, "gen1-1": 3}
    assert {r["status"] for r in t.table("requests").to_pylist()} == {"error"}


def test_a_script_without_torch_gets_an_empty_trace_and_a_note(tmp_path: Path) -> None:
    r = record(tmp_path / "t", sys.executable, str(SCRIPTS / "no_torch.py"), "7")
    assert r.returncode == 7  # the script's own code
    assert r.stdout.startswith("grandchild sees None")  # a child of the script does not record
    assert r.stderr.count("\n") == 1 and "never imported torch" in r.stderr
    report = validate(tmp_path / "t")
    assert {t["table"]: t["rows"] for t in report["tables"]} == {"spans": 0, "tokens": 0}
    assert NO_TORCH_NOTE in open_trace(tmp_path / "t").meta["notes"]


def test_the_programs_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = 'yes'\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = record(tmp_path / "t", sys.executable, str(SCRIPTS / "no_torch.py"), env=env)
    assert r.returncode == 0, r.stderr
    assert "marker yes" in r.stdout
    validate(tmp_path / "t")


def test_a_command_that_is_not_python_gets_an_empty_trace(tmp_path: Path) -> None:
    r = record(tmp_path / "t", "true")
    assert r.returncode == 0
    assert NOT_LOADED_NOTE in open_trace(tmp_path / "t").meta["notes"]
    validate(tmp_path / "t")


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signals_sent_to_tracetool_reach_the_program(tmp_path: Path, sig: int, code: int) -> None:
    p = subprocess.Popen([sys.executable, "-m", "tracetool", "record", "-o", str(tmp_path / "t"), "--",
                          sys.executable, str(SCRIPTS / "wait_for_signal.py")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=_sigint_default)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        p.send_signal(sig)
        p.wait(timeout=60)  # stdin stays open: the program can only end by the signal
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == code, err
    assert validate(tmp_path / "t")["closed"] is True


@pytest.mark.parametrize(("args", "message"), [
    ((), "Missing argument"),
    (("--", "no-such-command-xyz"), "command not found: no-such-command-xyz"),
])
def test_usage_errors(tmp_path: Path, cli: Any, args: tuple[str, ...], message: str) -> None:
    r = cli("record", "-o", tmp_path / "t", *args)
    assert r.code == 2 and message in r.err


def test_an_existing_trace_is_only_replaced_with_force(tmp_path: Path, cli: Any) -> None:
    out = tmp_path / "t"
    out.mkdir()
    (out / "meta.json").write_text("{}")
    r = cli("record", "-o", out, "--", "true")
    assert r.code == 2 and "--force" in r.err
    assert cli("record", "-o", out, "--force", "--", "true").code == 0
    validate(out)


def test_samplers_write_a_side_trace_merged_into_the_recording(tmp_path: Path, monkeypatch: Any,
                                                                capsys: Any) -> None:
    (tmp_path / "fake_sampler.py").write_text(textwrap.dedent("""
        import time

        def start(recorder, hz, pid):
            recorder.sink("gpu").append((time.time_ns(), 0, 50.0) + (None,) * 12)
            recorder.note(f"fake sampler at {hz:g} Hz on pid {pid}")
            return lambda: recorder.sink("gpu").append((time.time_ns(), 0, 60.0) + (None,) * 12)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(SAMPLERS, "fake", SamplerSpec("fake_sampler:start", 5.0, "A test sampler."))
    code = run_recording([sys.executable, str(SCRIPTS / "no_torch.py")], tmp_path / "t", samplers={"fake": 2.0})
    assert code == 0
    t = open_trace(tmp_path / "t")
    assert t.table("gpu").column("sm_util_pct").to_pylist() == [50.0, 60.0]
    assert any(n.startswith("fake sampler at 2 Hz on pid ") for n in t.meta["notes"])
    assert NO_TORCH_NOTE in t.meta["notes"]
    assert not list(tmp_path.glob(".t.samplers-*"))
    validate(tmp_path / "t")
