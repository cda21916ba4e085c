"""Bad input under a memory cap: the real console entry point in a child with RLIMIT_AS.

A sample of fuzzed inputs (fixed seed) and a decompression bomb (a 100 KB
Parquet file that holds 40 million rows) go through ``python -m tracetool`` in
children whose address space is capped. A reader that believed a corrupt
length, or inflated the bomb, must fail in one line with exit 3 (the cap is
an ``ArrowMemoryError``/``MemoryError`` it turns into bad input), never with a
traceback or a kill by the kernel.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fuzz.fuzzlib import CORPUS, assert_clean_process, run_limited
from tests.fuzz.mutators import mutate_bytes

TRACES = sorted(p for p in (CORPUS / "traces").iterdir() if p.is_dir())
#: Enough for Python, pyarrow and a small trace; far less than the bomb inflates to.
CAP_MIB = 1536
#: ``analyze`` also starts DuckDB's worker threads, whose stacks and malloc arenas count against
#: RLIMIT_AS (address space, not memory): a valid sample trace needs more than 2 GiB of it.
ANALYZE_CAP_MIB = 4096


def _sample(tmp: Path, n: int) -> list[Path]:
    rng = random.Random(1)
    out = []
    for i in range(n):
        src = rng.choice(TRACES)
        dst = tmp / f"m{i}"
        shutil.copytree(src, dst)
        victim = rng.choice([p for p in dst.iterdir() if p.name != "meta.json"])
        ops = [(rng.choice(["flip", "set", "cut", "dup", "int32"]), rng.random(),
                rng.choice([0, 7, 255, 0x7FFFFFFF, 64])) for _ in range(rng.randint(1, 4))]
        ops = [(op, w, (a % 8 if op == "flip" else a % 256 if op == "set" else a)) for op, w, a in ops]
        victim.write_bytes(mutate_bytes(victim.read_bytes(), ops))
        out.append(dst)
    return out


@pytest.mark.slow
def test_fuzzed_traces_under_a_memory_cap(tmp_path: Path) -> None:
    for trace in _sample(tmp_path, 6):
        assert_clean_process(run_limited(("validate", trace), mem_mib=CAP_MIB))
        assert_clean_process(run_limited(("analyze", "--json", trace), mem_mib=ANALYZE_CAP_MIB))


def _bomb(path: Path, rows: int) -> None:
    """A tokens table of ``rows`` identical rows: dictionary + RLE make it tiny on disk."""
    chunk = 1_000_000
    one = pa.table({"request_id": pa.array(["r"] * chunk), "index": pa.array([0] * chunk, pa.int32()),
                    "emit_ns": pa.array([1] * chunk, pa.int64())})
    with pq.ParquetWriter(path, one.schema, compression="zstd") as w:
        for _ in range(rows // chunk):
            w.write_table(one)


@pytest.mark.slow
def test_a_decompression_bomb_is_one_line_under_a_memory_cap(tmp_path: Path) -> None:
    trace = tmp_path / "bomb"
    trace.mkdir()
    (trace / "meta.json").write_text('{"format": "tracetool", "version": 1}')
    _bomb(trace / "tokens.parquet", 40_000_000)
    assert (trace / "tokens.parquet").stat().st_size < 2 << 20
    for args in (("validate", trace), ("info", trace)):
        p = run_limited(args, mem_mib=CAP_MIB, timeout_s=120)
        assert_clean_process(p)
        assert p.returncode == 3, p.stderr
        assert "memory" in p.stderr.lower(), p.stderr
