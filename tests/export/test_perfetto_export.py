"""`tracetool export --perfetto`: valid trace-event JSON, one track per request, nothing lost."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import make_trace, spans_table
from tests.export.perfetto_check import check_trace_events

S0 = 1_700_000_000_000_000_000  # server clock (Unix ns)
C0 = 42_000_000_123  # client clock: unrelated
MS = 1_000_000


def _server_trace(tmp_path: Path) -> Path:
    """Two requests as tracetool's collectors record them, plus one with overlapping spans."""
    spans = []
    tokens: dict[str, list] = {k: [] for k in ("request_id", "index", "emit_ns", "kv_len", "client_recv_ns",
                                               "batch_size", "step_id")}
    for k, rid in enumerate(("r1", "r2")):
        t = S0 + k * 30 * MS + 7  # odd nanoseconds: sub-µs precision must survive
        first, last = t + 40 * MS, t + 40 * MS + 9 * 20 * MS
        spans += [(rid, "server.request", t, last + MS, "server"), (rid, "tokenize", t, t + MS, "server"),
                  (rid, "queue", t + MS, t + 5 * MS, "server"), (rid, "prefill", t + 5 * MS, first, "server"),
                  (rid, "decode", first, last, "server"), (rid, "detokenize", last, last + MS, "server"),
                  (rid, "client.request", C0 + k * 30 * MS - 3 * MS, C0 + k * 30 * MS + 200 * MS, "client")]
        for i in range(10):
            tokens["request_id"].append(rid)
            tokens["index"].append(i)
            tokens["emit_ns"].append(first + i * 20 * MS)
            tokens["kv_len"].append(500 + i)
            tokens["client_recv_ns"].append(None if (rid, i) == ("r2", 3) else C0 + k * 30 * MS + 38 * MS + i * 20 * MS)
            tokens["batch_size"].append(2)
            tokens["step_id"].append(i)
    # r3: tokenize overlaps queue without nesting (a pipelined server), and has no tokens
    spans += [("r3", "tokenize", S0 + 100 * MS, S0 + 110 * MS, "server"),
              ("r3", "queue", S0 + 105 * MS, S0 + 120 * MS, "server")]
    gpu = pa.table({"ts_ns": pa.array([S0 + i * 50 * MS for i in range(5)], pa.int64()),
                    "gpu": pa.array([0, 0, 0, 1, 1], pa.int32()),
                    "sm_util_pct": [90.5, None, 95.0, float("nan"), 40.0],
                    "power_w": [500.0, 510.0, None, None, 120.0],
                    "mem_used_bytes": pa.array([7 * 2**30] * 5, pa.int64())})
    steps = pa.table({"step_id": pa.array(range(3), pa.int64()),
                      "start_ns": pa.array([S0 + 5 * MS, S0 + 45 * MS, S0 + 65 * MS], pa.int64()),
                      "end_ns": pa.array([S0 + 45 * MS, S0 + 65 * MS, S0 + 85 * MS], pa.int64()),
                      "batch_size": pa.array([1, 2, 2], pa.int32()),
                      "prefill_tokens": pa.array([500, 0, 0], pa.int32()),
                      "decode_tokens": pa.array([0, 2, 2], pa.int32()),
                      "kv_tokens": pa.array([500, 1001, 1003], pa.int64())})
    requests = pa.table({"request_id": ["r1", "r2", "r3"], "prompt_tokens": pa.array([500, 500, 9], pa.int32()),
                         "output_tokens": pa.array([10, 10, 0], pa.int32()), "status": ["ok", "ok", "error"]})
    tok = pa.table({k: pa.array(v, pa.string() if k == "request_id" else
                                (pa.int32() if k in ("index", "kv_len", "batch_size") else pa.int64()))
                    for k, v in tokens.items()})
    return make_trace(tmp_path / "trace", {"spans": spans_table(spans), "tokens": tok, "gpu": gpu,
                                           "steps": steps, "requests": requests})


def _export(cli, trace: Path, out: Path) -> dict:
    r = cli("export", trace, "--perfetto", out)
    assert r.code == 0, r.err
    assert "ui.perfetto.dev" in r.out
    return json.loads(out.read_text())


def _named_threads(doc: dict) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def test_export_is_well_formed_trace_event_json(cli, tmp_path: Path) -> None:
    doc = _export(cli, _server_trace(tmp_path), tmp_path / "out.json")
    assert check_trace_events(doc) == []
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert procs[1].startswith("server") and procs[2].startswith("client") and procs[3].startswith("engine")
    assert "unrelated" in procs[2]


def test_each_request_has_its_tracks_and_every_span_and_token(cli, tmp_path: Path) -> None:
    doc = _export(cli, _server_trace(tmp_path), tmp_path / "out.json")
    threads = _named_threads(doc)
    per_request: Counter[tuple[str, str]] = Counter()
    for e in doc["traceEvents"]:
        if e["ph"] == "B" and e["pid"] in (1, 2):
            per_request[(e["args"]["request_id"], "span")] += 1
            assert threads[(e["pid"], e["tid"])].startswith(e["args"]["request_id"])
        elif e["ph"] == "i":
            per_request[(e["args"]["request_id"], e["name"])] += 1
            assert threads[(e["pid"], e["tid"])] == e["args"]["request_id"]
    # round trip: events per request = its spans + its tokens (+ the client's receipts)
    assert per_request == {("r1", "span"): 7, ("r1", "token"): 10, ("r1", "token recv"): 10,
                           ("r2", "span"): 7, ("r2", "token"): 10, ("r2", "token recv"): 9,
                           ("r3", "span"): 2}
    # request tracks are per request: one server and one client track each, distinct
    server_tracks = {t for (p, t), n in threads.items() if p == 1 and "(overlap" not in n}
    assert len(server_tracks) == 3
    assert {n for (p, _), n in threads.items() if p == 2} == {"r1", "r2"}
    # r3's non-nesting spans are both kept, on two tracks
    assert {n for (p, _), n in threads.items() if p == 1 and n.startswith("r3")} == {"r3", "r3 (overlap 1)"}
    client_b = [e for e in doc["traceEvents"] if e["ph"] == "B" and e["pid"] == 2]
    assert all("unrelated to the server clock" in e["args"]["clock"] for e in client_b)
    top = next(e for e in doc["traceEvents"] if e["ph"] == "B" and e["name"] == "server.request")
    assert (top["args"]["prompt_tokens"], top["args"]["output_tokens"], top["args"]["status"]) == (500, 10, "ok")


def test_timestamps_are_relative_microseconds_per_clock_with_ns_decimals(cli, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    doc = _export(cli, _server_trace(tmp_path), out)
    text = out.read_text()
    ev = doc["traceEvents"]
    server_ts = [e["ts"] for e in ev if e.get("pid") in (1, 3) and "ts" in e]
    client_ts = [e["ts"] for e in ev if e.get("pid") == 2 and "ts" in e]
    assert min(server_ts) == 0 and min(client_ts) == 0  # each clock starts at its own zero
    token = next(e for e in ev if e["ph"] == "i" and e["name"] == "token" and e["args"]["request_id"] == "r2"
                 and e["args"]["index"] == 4)
    expected_ns = 30 * MS + 7 + 40 * MS + 4 * 20 * MS  # from the first server event (r1's start)
    assert round(token["ts"] * 1000) == expected_ns
    assert f'"ts":{expected_ns // 1000}.{expected_ns % 1000:03d}' in text  # exact, nanoseconds kept
    assert (token["args"]["kv_len"], token["args"]["batch_size"], token["args"]["step_id"]) == (504, 2, 4)
    assert "displayTimeUnit" not in doc


def test_gpu_counters_and_engine_steps(cli, tmp_path: Path) -> None:
    doc = _export(cli, _server_trace(tmp_path), tmp_path / "out.json")
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert [(c["name"], c["args"]) for c in counters] == [
        ("GPU 0", {"sm_util_pct": 90.5, "power_w": 500.0, "mem_used_bytes": 7 * 2**30}),
        ("GPU 0", {"power_w": 510.0, "mem_used_bytes": 7 * 2**30}),
        ("GPU 0", {"sm_util_pct": 95.0, "mem_used_bytes": 7 * 2**30}),
        ("GPU 1", {"mem_used_bytes": 7 * 2**30}),  # NaN and nulls are left out, never written
        ("GPU 1", {"sm_util_pct": 40.0, "power_w": 120.0, "mem_used_bytes": 7 * 2**30}),
    ]
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for c in counters for v in c["args"].values())
    steps = [e for e in doc["traceEvents"] if e["ph"] == "B" and e["pid"] == 3]
    assert [s["args"]["step_id"] for s in steps] == [0, 1, 2]
    assert steps[0]["args"]["prefill_tokens"] == 500


def test_imported_trace_puts_tokens_on_the_client_track(cli, tmp_path: Path) -> None:
    fixture = Path(__file__).parent.parent / "importers" / "fixtures" / "aiperf_profile_export.jsonl"
    trace = tmp_path / "imported"
    assert cli("import", "aiperf", fixture, "-o", trace).code == 0
    doc = _export(cli, trace, tmp_path / "out.json")
    assert check_trace_events(doc) == []
    tokens = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert tokens and {e["pid"] for e in tokens} == {2} and {e["name"] for e in tokens} == {"token"}
    assert not any(e.get("pid") == 1 for e in doc["traceEvents"])  # no server clock, no server process
    assert doc["otherData"]["tokens_emit_clock"] == "client"
    spans = [e for e in doc["traceEvents"] if e["ph"] == "B"]
    assert len(spans) == 5 and len(tokens) == doc["otherData"]["stats"]["tokens"] == 69


def test_empty_trace_and_stdout(cli, tmp_path: Path) -> None:
    trace = make_trace(tmp_path / "empty", {})
    doc = _export(cli, trace, tmp_path / "out.json")
    assert doc["traceEvents"] == [] and check_trace_events(doc) == []
    r = cli("export", _server_trace(tmp_path), "--perfetto", "-")
    assert r.code == 0 and check_trace_events(json.loads(r.out)) == []


@pytest.mark.parametrize("case", ["no trace", "not a trace", "bad output dir"])
def test_bad_input_is_one_line(cli, tmp_path: Path, case: str) -> None:
    trace = {"no trace": tmp_path / "missing", "not a trace": tmp_path}.get(case) or _server_trace(tmp_path)
    out = tmp_path / "no" / "such" / "dir" / "out.json" if case == "bad output dir" else tmp_path / "o.json"
    r = cli("export", trace, "--perfetto", out)
    assert r.code == 3
    assert len(r.err.strip().splitlines()) == 1 and r.err.startswith("tracetool: error: ")
    assert not out.exists()


@pytest.mark.parametrize(("events", "problem"), [
    ([{"ph": "E", "pid": 1, "tid": 1, "ts": 1}], "E without an open B"),
    ([{"ph": "B", "pid": 1, "tid": 1, "ts": 1, "name": "a"}], "B without E"),
    ([{"ph": "B", "pid": 1, "tid": 1, "ts": 1, "name": "a"}, {"ph": "B", "pid": 1, "tid": 1, "ts": 2, "name": "b"},
      {"ph": "E", "pid": 1, "tid": 1, "ts": 3, "name": "a"}, {"ph": "E", "pid": 1, "tid": 1, "ts": 3, "name": "b"}],
     "closes B"),
    ([{"ph": "B", "pid": 1, "tid": 1, "ts": 5, "name": "a"}, {"ph": "E", "pid": 1, "tid": 1, "ts": 4, "name": "a"}],
     "goes back"),
    ([{"ph": "C", "pid": 3, "ts": 1, "name": "GPU 0", "args": {"x": "high"}}], "not a finite number"),
    ([{"ph": "i", "pid": 1, "tid": 1, "ts": 1, "name": "token"}], "missing ['s']"),
    ([{"ph": "M", "pid": 1, "name": "thread_name", "args": {"name": "x"}}], "without tid"),
])
def test_the_checker_catches_broken_files(events: list, problem: str) -> None:
    """The checker used above can fail: each broken document is reported."""
    assert any(problem in p for p in check_trace_events({"traceEvents": events}))


def test_thread_ids_are_unique_across_processes(cli, tmp_path: Path) -> None:
    """Perfetto keys threads by tid first (as on Linux): a tid shared by two processes, or equal
    to a pid (the tid of events without one), would merge or split tracks."""
    doc = _export(cli, _server_trace(tmp_path), tmp_path / "out.json")
    pids_of: dict[int, set[int]] = {}
    for e in doc["traceEvents"]:
        if "tid" in e:
            pids_of.setdefault(e["tid"], set()).add(e["pid"])
    assert all(len(p) == 1 for p in pids_of.values()), pids_of
    assert not set(pids_of) & {1, 2, 3}
    assert all("tid" in e for e in doc["traceEvents"] if e["ph"] == "C")
