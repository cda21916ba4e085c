"""A request's spans, through the per-token path (RequestHandle.add_span) and the general one
(Recorder.add_span): the same rows, durations, normalisation, errors and drops; span names keep
their codes when a request id equal to one is retired."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from collectors import Recorder
from tracetool.reader import open_trace


def _spans(path: Path) -> list[tuple[object, ...]]:
    return sorted(tuple(r.values()) for r in open_trace(path, strict=True).table("spans").to_pylist())


def test_the_handles_path_writes_what_the_recorders_path_writes(tmp_path: Path) -> None:
    times = [("decode", 100, 250), ("detokenize", 250, 260), ("decode", 260, 400), ("queue", 0, 100)]
    got = {}
    for way in ("handle", "recorder"):
        rec = Recorder(tmp_path / way).start()
        with rec.request("r1") as req:
            for name, a, b in times:
                if way == "handle":
                    req.add_span(name, a, b)
                else:
                    rec.add_span(name, a, b)  # the current request's, through the general path
            durations = dict(req.durations_ns)
        rec.close()
        got[way] = (_spans(tmp_path / way), durations)
    assert got["handle"] == got["recorder"]
    assert got["handle"][1] == {"decode": 290, "detokenize": 10, "queue": 100}
    assert ("r1", "decode", 100, 250, "server") in got["handle"][0]


def test_odd_times_are_normalised_or_counted(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "t").start()
    req = rec.request("r1")
    req.add_span("decode", np.int64(5), np.int64(9))  # a numpy integer: packed as is
    req.add_span("decode", 10.0, 12.5)  # floats: the general path makes them ints
    req.add_span("decode", None, 3)  # type: ignore[arg-type]  # not a time: counted, not raised
    req.add_span("client.request", 1, 2, clock="client")  # another clock: not a server duration
    req.finish()
    rec.close()
    assert rec.errors >= 1
    assert _spans(tmp_path / "t") == [("r1", "client.request", 1, 2, "client"), ("r1", "decode", 5, 9, "server"),
                                      ("r1", "decode", 10, 12, "server")]


def test_switched_off_the_spans_still_add_up_for_server_timing(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "t", enabled=False).start()
    req = rec.request("r1")
    req.add_span("decode", 0, 40)
    req.add_span("decode", 50, 60)
    req.finish()
    rec.close()
    assert req.durations_ns == {"decode": 50}
    assert _spans(tmp_path / "t") == []


def test_spans_beyond_the_cap_are_dropped_and_counted(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "t", max_pending_rows=2, flush_interval_s=3600, flush_rows=1 << 20).start()
    req = rec.request("r1")
    for i in range(5):
        req.add_span("decode", i, i + 1)
    req.finish()
    rec.close()
    t = open_trace(tmp_path / "t", strict=True)
    assert t.rows("spans") == 2 and t.meta["dropped_rows"]["spans"] == 3


def test_a_request_id_equal_to_a_span_name_does_not_unname_the_spans(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "t", flush_interval_s=0.001).start()
    with rec.request("decode") as req:  # retired when it ends, as every request id is
        req.add_span("decode", 0, 1)
    for i in range(4):  # the interner forgets retired codes two flushes later
        rec.writer.flush()
        with rec.request(f"r{i}") as other:
            other.add_span("decode", 10 + i, 11 + i)
    rec.close()
    names = {row[1] for row in _spans(tmp_path / "t")}
    assert names == {"decode"}
