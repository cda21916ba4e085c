"""validate / info / convert: what they check, and one line + exit 3 on every bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import make_trace, run_tracetool, spans_table
from tracetool.writer import TraceWriter

GOOD_SPANS = [("r1", "server.request", 0, 100, "server"), ("r1", "decode", 10, 90, "server")]
TOKENS = {"request_id": ["r1", "r1"], "index": pa.array([0, 1], pa.int32()), "emit_ns": [10, 90]}


def good(tmp_path: Path) -> Path:
    return make_trace(tmp_path / "t", {"spans": spans_table(GOOD_SPANS), "tokens": TOKENS})


def test_validate_says_what_it_checked(tmp_path: Path, cli) -> None:
    r = cli("validate", good(tmp_path))
    assert r.code == 0, r.err
    assert "end_ns >= start_ns" in r.out and "clocks" in r.out and "not recorded" in r.out
    assert r.out.strip().splitlines()[-1].startswith("valid:")
    j = cli("validate", "--json", tmp_path / "t")
    doc = json.loads(j.out)
    assert doc["valid"] is True and {t["table"] for t in doc["tables"]} == {"spans", "tokens"}


def test_info_reports_requests_tokens_tables(tmp_path: Path, cli) -> None:
    r = cli("info", "--json", good(tmp_path))
    assert r.code == 0
    doc = json.loads(r.out)
    assert doc["requests"] == 1 and doc["tokens"] == 2
    assert doc["tables"]["spans"]["rows"] == 2 and doc["server_time_span_s"] == pytest.approx(1e-7)
    text = cli("info", tmp_path / "t").out
    assert "requests" in text and "tokens" in text


def _bad_cases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    cases: dict[str, tuple[Path, str]] = {}

    def case(name: str, needle: str, **kw) -> Path:
        d = tmp_path / name
        cases[name] = (d, needle)
        return d

    make_trace(case("wrong_version", "unsupported trace version 2"), {"tokens": TOKENS}, meta={"version": 2})
    make_trace(case("wrong_format", '"format" must be'), {"tokens": TOKENS}, meta={"format": "other"})
    make_trace(case("missing_column", "table tokens, column emit_ns: required column missing"),
               {"tokens": {"request_id": ["a"], "index": pa.array([0], pa.int32())}})
    make_trace(case("wrong_type", "table tokens, column emit_ns: type string not accepted"),
               {"tokens": {"request_id": ["a"], "index": [0], "emit_ns": ["soon"]}})
    make_trace(case("end_before_start", "table spans, column end_ns: 1 row(s) with end_ns < start_ns"),
               {"spans": spans_table([("r", "decode", 10, 5, "server")])})
    make_trace(case("unknown_clock", "unknown clock 'gps'"),
               {"spans": spans_table([("r", "decode", 1, 5, "gps")])})
    make_trace(case("null_required", "1 null value(s) in a required column"),
               {"tokens": {"request_id": ["a", None], "index": [0, 1], "emit_ns": [1, 2]}})
    make_trace(case("negative_index", "negative index"),
               {"tokens": {"request_id": ["a"], "index": [-1], "emit_ns": [1]}})
    case("empty_dir", "no meta.json").mkdir()
    f = case("not_a_trace", "not a trace")
    f.write_text("hello")
    d = make_trace(case("garbage_table", "not an Arrow IPC stream"), {})
    (d / "tokens.arrows").write_bytes(b"\x00garbage\x01" * 10)
    d = case("bad_meta_json", "unreadable JSON")
    d.mkdir()
    (d / "meta.json").write_text("{not json")
    make_trace(case("bad_model_block", '"model.params" must be a non-negative number'), {},
               meta={"model": {"params": "big"}})
    # a Hugging Face name is read as tracetool's key, so it is checked as one
    make_trace(case("bad_hf_model_key", '"model.num_key_value_heads" must be a non-negative number'), {},
               meta={"model": {"num_key_value_heads": -8}})
    cases["missing_path"] = (tmp_path / "nope", "no such file or directory")
    return cases


def test_every_bad_input_exits_3_with_one_line(tmp_path: Path, cli) -> None:
    for name, (path, needle) in _bad_cases(tmp_path).items():
        for command in ("validate", "info"):
            r = cli(command, path)
            assert r.code == 3, (name, command, r.err)
            lines = r.err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("tracetool: error: "), (name, r.err)
            assert needle in lines[0], (name, lines[0])
            assert r.out == "", "stdout is data: nothing on failure"


def test_bad_input_in_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    cases = _bad_cases(tmp_path)
    p = run_tracetool("validate", cases["wrong_type"][0])
    assert p.returncode == 3 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_usage_error_exits_2(cli) -> None:
    assert cli("validate").code == 2
    assert cli("no-such-command").code == 2


def _stream_trace(tmp_path: Path, batches: int = 5) -> tuple[Path, list[int]]:
    """A trace written by the real writer, flushing one batch at a time; returns batch end offsets."""
    d = tmp_path / "stream"
    with TraceWriter(d, flush_interval_s=3600, flush_rows=10**9) as w:
        ends = []
        for b in range(batches):
            for i in range(20):
                w.sink("tokens").append(("r", b * 20 + i, i, None, None, None, None, None, None))
            w.flush()
            ends.append((d / "tokens.arrows").stat().st_size)
    return d, ends


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_stream_cut_at_any_offset(tmp_path: Path, cli, data: st.DataObject) -> None:
    """A cut stream never crashes: validate exits 3 (one line) unless the cut falls on a batch
    boundary; info keeps exactly the complete batches before the cut."""
    d, ends = _stream_trace(tmp_path)
    full = (d / "tokens.arrows").read_bytes()
    cut = data.draw(st.integers(0, len(full) - 1))
    (d / "tokens.arrows").write_bytes(full[:cut])
    complete = sum(1 for e in ends if e <= cut)
    schema_end = ends[0] - (ends[1] - ends[0])  # the schema message precedes the first batch
    v = cli("validate", d)
    boundary = cut in ends or cut == schema_end
    if boundary:
        assert v.code == 0, v.err
    else:
        assert v.code == 3 and len(v.err.strip().splitlines()) == 1, v.err
    i = cli("info", "--json", d)
    if 0 < cut < schema_end:  # not even a schema: nothing to keep
        assert i.code == 3 and len(i.err.strip().splitlines()) == 1
    else:  # an empty file (killed before the schema) is skipped with a warning
        assert i.code == 0, i.err
        assert json.loads(i.out)["tokens"] == complete * 20


def test_convert_compacts_segments_and_recovers_a_cut_stream(tmp_path: Path, cli) -> None:
    d, ends = _stream_trace(tmp_path)
    full = (d / "tokens.arrows").read_bytes()
    (d / "tokens.arrows").write_bytes(full[: ends[2] + 7])  # cut inside the 4th batch
    assert cli("validate", d).code == 3
    out = tmp_path / "out"
    r = cli("convert", d, "--to", "parquet", "-o", out)
    assert r.code == 0, r.err
    assert "stream cut after 3 complete batches" in r.err
    assert cli("validate", out).code == 0
    assert json.loads(cli("info", "--json", out).out)["tokens"] == 60
    assert cli("convert", d, "-o", out).code == 2, "refuses to overwrite without --force"


def test_validate_checks_server_metrics(tmp_path: Path, cli) -> None:
    def metrics(clock: str, value: float | None = 1.0) -> dict:
        return {"ts_ns": [1, 2], "name": ["vllm:num_requests_waiting"] * 2, "labels": ["{}", "{}"],
                "value": pa.array([1.0, value], pa.float64()), "clock": [clock, clock]}

    ok = make_trace(tmp_path / "ok", {"spans": spans_table(GOOD_SPANS), "server_metrics": metrics("client")})
    r = cli("validate", ok)
    assert r.code == 0, r.err
    assert "server_metrics" in r.out and "required ts_ns/name/labels/value" in r.out
    bad = make_trace(tmp_path / "bad", {"spans": spans_table(GOOD_SPANS), "server_metrics": metrics("gpu")})
    r = cli("validate", bad)
    assert r.code == 3 and "server_metrics" in r.err and "unknown clock 'gpu'" in r.err
    assert "Traceback" not in r.err
    null = make_trace(tmp_path / "null", {"spans": spans_table(GOOD_SPANS), "server_metrics": metrics("client", None)})
    r = cli("validate", null)
    assert r.code == 3 and "value" in r.err


def test_validate_warns_of_model_keys_the_analysis_would_not_use(tmp_path: Path, cli) -> None:
    """A meta.json model key tracetool does not read is valid, but said, as ``analyze`` says it."""
    trace = make_trace(tmp_path / "t", {"spans": spans_table(GOOD_SPANS), "tokens": TOKENS},
                       {"model": {"name": "m", "num_key_value_headz": 4}})
    r = cli("validate", trace)
    assert r.code == 0, r.err
    assert "num_key_value_headz" in r.err and "not used" in r.err
    doc = json.loads(cli("validate", "--json", trace).out)
    assert any("num_key_value_headz" in w for w in doc["warnings"])
    assert cli("validate", good(tmp_path / "clean")).err == ""
