"""A recorder killed with SIGKILL leaves a trace that validates and holds every flushed row."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest

from tracetool.reader import open_trace

CHILD = r"""
import sys, time
from collectors import Recorder
rec = Recorder(sys.argv[1], flush_interval_s=0.02, flush_rows=300).start()
i = 0
with rec.request("r") as req:
    while True:
        req.token(i, kv_len=i)
        rec.add_span("decode", i, i + 1)
        i += 1
        if i % 997 == 0:
            rec.writer.flush()
            print(i, flush=True)  # every row below i is on disk
"""


@pytest.mark.slow
def test_sigkill_at_random_moments_keeps_every_flushed_row(tmp_path: Path) -> None:
    rng = random.Random(1234)
    for attempt in range(4):
        out = tmp_path / f"trace{attempt}"
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(out)], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        flushed = 0
        for _ in range(rng.randint(1, 15)):
            flushed = int(child.stdout.readline())
        time.sleep(rng.uniform(0, 0.05))  # kill at a random moment, not right after a flush
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        assert child.returncode == -signal.SIGKILL

        trace = open_trace(out, strict=True)  # what `tracetool validate` checks
        assert trace.meta["closed"] is False
        index = trace.table("tokens").column("index")
        assert len(index) >= flushed
        present = set(pc.unique(index).to_pylist())
        assert set(range(flushed)) <= present, f"attempt {attempt}: rows flushed before the kill were lost"
        assert trace.rows("spans") >= flushed


def test_torn_last_batch_of_an_unclosed_recording_is_valid(tmp_path: Path) -> None:
    """A kill inside write() tears the last message; meta.json's closed=false makes that expected."""
    from tracetool.writer import TraceWriter

    with TraceWriter(tmp_path, flush_interval_s=3600) as w:
        for b in range(3):
            for i in range(50):
                w.sink("tokens").append(("r", b * 50 + i, i, None, None, None, None, None, None))
            w.flush()
    path = tmp_path / "tokens.arrows"
    data = path.read_bytes()
    path.write_bytes(data[:-200])  # inside the last batch (its EOS marker is 8 bytes)
    import json

    meta = json.loads((tmp_path / "meta.json").read_text())
    meta["closed"] = False
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    trace = open_trace(tmp_path, strict=True)
    assert trace.rows("tokens") == 100
    assert any("stream cut after 2 complete batches" in w for w in trace.warnings)
