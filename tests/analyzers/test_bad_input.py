"""Bad input: one clear line on stderr and the documented exit code, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from analyzer_scenarios import MS, rows, spans, tokens, write_trace

import analyzers
from tracetool.errors import BadInput


def _gpu_only(path: Path) -> Path:
    return write_trace(path, {"gpu": pa.table({"ts_ns": pa.array([1], pa.int64()), "gpu": pa.array([0], pa.int32())})})


def test_missing_tables(cli: Any, tmp_path: Path) -> None:
    r = cli("analyze", _gpu_only(tmp_path / "g"))
    assert r.code == 3 and r.out == ""
    assert r.err.startswith("tracetool: error: ") and "neither a spans nor a tokens table" in r.err
    assert r.err.count("\n") == 1


def test_zero_requests(cli: Any, tmp_path: Path) -> None:
    empty = write_trace(tmp_path / "e", {"spans": spans([]), "tokens": tokens([])})
    r = cli("analyze", "--json", empty)
    assert r.code == 3 and "no requests" in r.err and r.out == ""
    # spans that belong to no request (empty id) are not requests either
    anon = write_trace(tmp_path / "a", {"spans": spans([("", "gc", 0, 5 * MS, "server")])})
    r = cli("analyze", anon)
    assert r.code == 3 and "no requests" in r.err


def test_spans_that_give_no_time_and_no_tokens(cli: Any, tmp_path: Path) -> None:
    # client-clock spans that are not client.request: a request exists but nothing can be measured
    p = write_trace(tmp_path / "c", {"spans": spans([("r1", "render", 0, 5 * MS, "client")])})
    r = cli("analyze", p)
    assert r.code == 3 and "nothing to measure" in r.err and r.out == ""


def test_not_a_trace_and_missing_path(cli: Any, tmp_path: Path) -> None:
    assert cli("analyze", tmp_path / "nope").code == 3
    (tmp_path / "junk").mkdir()
    r = cli("analyze", tmp_path / "junk")
    assert r.code == 3 and "tracetool: error:" in r.err


def test_one_bad_trace_among_several_is_named(cli: Any, tmp_path: Path) -> None:
    from analyzer_scenarios import toy_trace

    good = toy_trace(tmp_path / "good")
    r = cli("analyze", good, _gpu_only(tmp_path / "bad"))
    assert r.code == 3 and "bad" in r.err


def test_spans_without_tokens_still_attribute(cli: Any, tmp_path: Path) -> None:
    p = write_trace(tmp_path / "s", {"spans": spans([
        ("r1", "server.request", 0, 100 * MS, "server"), ("r1", "prefill", 10 * MS, 30 * MS, "server"),
        ("r1", "decode", 30 * MS, 90 * MS, "server")])})
    r = cli("analyze", "--json", p)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["bottleneck"] == "decode" and doc["components"]["other"]["ms"] == pytest.approx(20.0)
    assert doc["ttft_ms"]["n"] == 0 and doc["itl_ms"]["p50"] is None
    assert "TTFT, ITL and TPOT are not measured" in r.err


def test_tokens_without_spans_measure_itl_but_attribute_nothing(cli: Any, tmp_path: Path) -> None:
    p = write_trace(tmp_path / "t", {"tokens": tokens([
        {"request_id": "r", "index": i, "emit_ns": i * 10 * MS} for i in range(5)])})
    doc = json.loads(cli("analyze", "--json", p).out)
    assert doc["requests"] == 1 and doc["itl_ms"]["mean"] == pytest.approx(10.0)
    assert doc["bottleneck"] is None and not any(c["measured"] for c in doc["components"].values())
    assert doc["headline"] == "no component of e2e is measured"


def test_spans_without_request_spans_use_the_extent(tmp_path: Path) -> None:
    # an in-process trace (no server.request): e2e is the first-to-last server event
    p = write_trace(tmp_path / "hf", {
        "spans": spans([("r", "tokenize", 0, 2 * MS, "server"), ("r", "prefill", 2 * MS, 20 * MS, "server"),
                        ("r", "decode", 20 * MS, 60 * MS, "server")]),
        "tokens": tokens([{"request_id": "r", "index": i, "emit_ns": (20 + 20 * i) * MS} for i in range(3)])})
    con = analyzers.connect([p])
    r = rows(con, "SELECT e2e_ms, e2e_source, other_ms, ttft_ms, ttft_source FROM attribution_requests")[0]
    assert r == {"e2e_ms": 60.0, "e2e_source": "extent", "other_ms": None, "ttft_ms": 20.0, "ttft_source": "server"}


@pytest.mark.parametrize(("args", "msg"), [
    (["--claim", "it was aliens"], "unknown claim"),
    (["--threshold", "nonsense=1"], "unknown threshold"),
    (["--threshold", "supported_share"], "expected NAME=VALUE"),
    (["--gpu", "tpu-v9"], "unknown GPU"),
    (["--model", "llama-99b"], "unknown model"),
    (["--model", "llama-3.1-8b", "--weight-dtype", "fp3"], "unknown dtype"),
])
def test_usage_errors_exit_2(cli: Any, toy: Path, args: list[str], msg: str) -> None:
    r = cli("analyze", toy, *args)
    assert r.code == 2 and msg in r.err and r.out == ""


def test_corrupt_table_file_exits_3_without_traceback(tmp_path: Path) -> None:
    import subprocess
    import sys

    from analyzer_scenarios import toy_trace

    p = toy_trace(tmp_path / "t")
    (p / "tokens.arrows").write_bytes(b"not arrow at all")
    proc = subprocess.run([sys.executable, "-m", "tracetool", "analyze", str(p)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr and proc.stderr.startswith("tracetool: error:")


def test_library_raises_badinput(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="neither a spans nor a tokens table"):
        analyzers.analyze(_gpu_only(tmp_path / "g"))
