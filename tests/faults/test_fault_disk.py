"""The disk fails under a recording: full, over a file-size limit, made read-only, removed.

The host is a real child Python recording token rows in a loop
(``scripts/record_loop.py``). Whatever happens to the disk, the host runs to
the end (exit 0), the writer stops with one line on stderr, rows written and
dropped add up to the rows recorded, and what reached the disk before the
fault stays readable (and valid, when the directory still exists).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tracetool.reader import open_trace

SCRIPT = Path(__file__).resolve().parent / "scripts" / "record_loop.py"
N = 3000
STOPPED = "trace writer stopped"


def _no_dac_override() -> None:
    """Root ignores permission bits: drop CAP_DAC_OVERRIDE, DAC_READ_SEARCH and FOWNER from the bounding
    set before exec, so the child meets a read-only directory as any user would."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2, 3):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _start(out: Path, *args: Any, drop_caps: bool = False) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, str(SCRIPT), str(out), str(N), *map(str, args)], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            preexec_fn=_no_dac_override if drop_caps else None)


def _until(proc: subprocess.Popen[str], word: str) -> int:
    """Read the child's lines up to ``word``; returns the rows flushed by then."""
    assert proc.stdout is not None
    flushed = 0
    for line in proc.stdout:
        if line.startswith("flushed"):
            flushed = int(line.split()[1])
        if line.startswith(word):
            return flushed
    raise AssertionError(f"child ended before {word!r}: {proc.wait()} {proc.stderr.read() if proc.stderr else ''}")


def _finish(proc: subprocess.Popen[str]) -> tuple[dict[str, Any], str]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"the host did not run to the end: {proc.returncode}\n{err}"
    summary = json.loads(out.strip().splitlines()[-1])
    assert "Traceback" not in err, err
    return summary, err


def _one_stop_line(err: str, why: str) -> None:
    lines = [ln for ln in err.splitlines() if STOPPED in ln]
    assert len(lines) == 1, err
    assert why in lines[0], lines[0]
    assert len(err.strip().splitlines()) <= 2, f"stderr should stay quiet:\n{err}"


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A temporary directory others may enter (pytest's tmp_path lives under a 0700 directory)."""
    d = Path(tempfile.mkdtemp(prefix="tracetool-faults-"))
    os.chmod(d, 0o755)
    yield d
    for p in [d, *d.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            os.chmod(p, 0o755)
    shutil.rmtree(d, ignore_errors=True)


def test_disk_full_stops_the_writer_and_keeps_what_was_written(shared_tmp: Path) -> None:
    """The second tokens segment lands on /dev/full (ENOSPC): the first one stays, valid."""
    out = shared_tmp / "t"
    out.mkdir()
    os.symlink("/dev/full", out / "tokens-000001.arrows")
    proc = _start(out, "--segment-bytes", 64 << 10)
    summary, err = _finish(proc)
    _one_stop_line(err, "No space left on device")
    assert summary["failed"] and summary["dropped"] > 0
    assert summary["written"] + summary["dropped"] == N
    os.unlink(out / "tokens-000001.arrows")  # what a user would delete: the file that never got data
    t = open_trace(out, strict=True)  # valid: tracetool validate passes
    assert t.rows("tokens") == summary["written"] > 0
    assert t.table("tokens").column("index").to_pylist() == list(range(summary["written"]))
    assert t.meta["closed"] is True
    assert any("writer stopped: No space left on device" in n for n in t.meta["notes"]), t.meta["notes"]
    assert t.meta["dropped_rows"]["tokens"] == summary["dropped"]


def test_file_size_limit_mid_message_leaves_a_valid_stream(shared_tmp: Path) -> None:
    """RLIMIT_FSIZE (SIGXFSZ ignored: EFBIG) cuts a write in the middle of a batch."""
    out = shared_tmp / "t"
    proc = _start(out, "--fsize-limit", 100_000 + 123)
    summary, err = _finish(proc)
    _one_stop_line(err, "File too large")
    assert summary["written"] + summary["dropped"] == N and summary["dropped"] > 0
    t = open_trace(out, strict=True)  # no torn last message: validate passes
    assert t.rows("tokens") == summary["written"]
    assert t.table("tokens").column("index").to_pylist() == list(range(summary["written"]))
    assert any("writer stopped: File too large" in n for n in t.meta["notes"]), t.meta["notes"]
    assert t.meta["dropped_rows"]["tokens"] == summary["dropped"]


def test_directory_made_read_only_mid_run(shared_tmp: Path) -> None:
    out = shared_tmp / "t"
    proc = _start(out, "--pause-at", 1000, "--segment-bytes", 64 << 10, drop_caps=True)
    flushed = _until(proc, "paused")
    os.chmod(out, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    summary, err = _finish(proc)
    _one_stop_line(err, "Permission denied")
    assert summary["written"] + summary["dropped"] == N and summary["dropped"] > 0
    t = open_trace(out, strict=True)  # what was on disk stays valid (meta.json could not be updated)
    index = t.table("tokens").column("index").to_pylist()
    assert index == list(range(len(index))) and len(index) >= flushed


def test_directory_removed_mid_run(shared_tmp: Path) -> None:
    out = shared_tmp / "t"
    proc = _start(out, "--pause-at", 1000, "--segment-bytes", 64 << 10)
    _until(proc, "paused")
    shutil.rmtree(out)
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    summary, err = _finish(proc)
    _one_stop_line(err, "No such file or directory")
    assert summary["written"] + summary["dropped"] == N and summary["dropped"] > 0
    assert not out.exists()  # nothing re-created behind the user's back
