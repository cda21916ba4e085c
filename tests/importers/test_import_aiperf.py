"""AIPerf profile_export.jsonl imports with AIPerf's TTFT, chunk gaps and request latency."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pyarrow.compute as pc

from tracetool.reader import open_trace

FIX = Path(__file__).parent / "fixtures"
US = 1_000


def _rows(trace, table, rid):
    t = trace.table(table)
    return t.filter(pc.equal(t.column("request_id"), rid)).to_pylist()


def _records(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIX / name).read_text().splitlines() if line.strip()]


def _import(cli, tmp_path: Path, name: str) -> Path:
    out = tmp_path / "trace"
    r = cli("import", "aiperf", FIX / name, "-o", out)
    assert r.code == 0, r.err
    assert cli("validate", out).code == 0
    return out


def test_records_match_aiperf_metrics(cli, tmp_path: Path) -> None:
    trace = open_trace(_import(cli, tmp_path, "aiperf_profile_export.jsonl"))
    records = _records("aiperf_profile_export.jsonl")
    assert trace.table("requests").num_rows == len(records)
    for rec in records:
        md, m = rec["metadata"], rec["metrics"]
        rid = md["x_request_id"]
        (row,) = _rows(trace, "requests", rid)
        if rec["error"]:
            assert row["status"] == "error"
            assert row["error"].startswith(f"{rec['error']['code']} {rec['error']['type']}: ")
            assert row["prompt_tokens"] == m["error_isl"]["value"]
            assert _rows(trace, "spans", rid) == []
            continue
        assert m["time_to_first_token"]["unit"] == "ms"
        (span,) = _rows(trace, "spans", rid)
        assert span["start_ns"] == md["request_start_ns"]
        assert abs((span["end_ns"] - span["start_ns"]) - m["request_latency"]["value"] * 1e6) <= US
        toks = sorted(_rows(trace, "tokens", rid), key=lambda t: t["index"])
        assert abs((toks[0]["emit_ns"] - span["start_ns"]) - m["time_to_first_token"]["value"] * 1e6) <= US
        gaps = [b["emit_ns"] - a["emit_ns"] for a, b in itertools.pairwise(toks)]
        icl = m["inter_chunk_latency"]["value"]
        assert len(gaps) == len(icl)
        assert all(abs(g - x * 1e6) <= US for g, x in zip(gaps, icl, strict=True))
        assert row["output_tokens"] == m["output_sequence_length"]["value"] == len(toks)
        assert [t["kv_len"] for t in toks] == [m["input_sequence_length"]["value"] + k for k in range(len(toks))]
    cancelled = next(r for r in records if r["metadata"]["was_cancelled"])
    (row,) = _rows(trace, "requests", cancelled["metadata"]["x_request_id"])
    assert row["error"].startswith("499 RequestCancellationError")


def test_early_format_with_timestamp_ns_and_ttft_tag(cli, tmp_path: Path) -> None:
    trace = open_trace(_import(cli, tmp_path, "aiperf_early_profile_export.jsonl"))
    for rec in _records("aiperf_early_profile_export.jsonl"):
        rid = rec["metadata"]["x_request_id"]
        (span,) = _rows(trace, "spans", rid)
        assert span["start_ns"] == rec["metadata"]["timestamp_ns"]
        toks = sorted(_rows(trace, "tokens", rid), key=lambda t: t["index"])
        assert abs((toks[0]["emit_ns"] - span["start_ns"]) - rec["metrics"]["ttft"]["value"] * 1e6) <= US


def test_partial_file_skips_bad_lines(cli, tmp_path: Path) -> None:
    out = tmp_path / "trace"
    r = cli("import", "aiperf", FIX / "partial_aiperf.jsonl", "-o", out)
    assert r.code == 0 and "3 request(s) skipped" in r.err
    notes = " | ".join(open_trace(out, strict=True).meta["notes"])
    assert "(line 1): time_to_first_token is negative" in notes
    assert "(line 2): metric inter_chunk_latency has unknown time unit 'fortnights'" in notes
    assert "(line 7): not valid JSON" in notes


def test_units_other_than_ms_and_non_streamed_records(cli, tmp_path: Path) -> None:
    rec = _records("aiperf_profile_export.jsonl")[0]
    m = rec["metrics"]
    ns = dict(rec, metrics={**m,
                            "time_to_first_token": {"value": m["time_to_first_token"]["value"] * 1e6, "unit": "ns"},
                            "inter_chunk_latency": {"value": [v / 1e3 for v in m["inter_chunk_latency"]["value"]],
                                                    "unit": "sec"}})
    plain = json.loads(json.dumps(rec))
    plain["metadata"]["x_request_id"] = "not-streamed"
    for k in ("time_to_first_token", "inter_chunk_latency", "time_to_second_token", "inter_token_latency"):
        plain["metrics"].pop(k)
    path = tmp_path / "profile_export.jsonl"
    path.write_text(json.dumps(ns) + "\n\n" + json.dumps(plain) + "\n")
    out = tmp_path / "t"
    assert cli("import", "aiperf", path, "-o", out).code == 0
    trace = open_trace(out)
    toks = sorted(_rows(trace, "tokens", rec["metadata"]["x_request_id"]), key=lambda t: t["index"])
    start = rec["metadata"]["request_start_ns"]
    assert abs(toks[0]["emit_ns"] - start - m["time_to_first_token"]["value"] * 1e6) <= US
    assert abs(toks[1]["emit_ns"] - toks[0]["emit_ns"] - m["inter_chunk_latency"]["value"][0] * 1e6) <= US
    assert _rows(trace, "tokens", "not-streamed") == []
    (span,) = _rows(trace, "spans", "not-streamed")
    assert abs(span["end_ns"] - span["start_ns"] - m["request_latency"]["value"] * 1e6) <= US
    assert any("no time_to_first_token (not streamed)" in n for n in trace.meta["notes"])
