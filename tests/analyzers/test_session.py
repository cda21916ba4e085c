"""A Session (analyzers.connection.Session) analyses successive snapshots of the same traces on
one DuckDB connection: every result must be the one a fresh connection gives."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from analyzers import analyze
from analyzers.connection import Session
from tracetool.reader import Trace, open_trace

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_traces"


def _first_requests(t: Trace, k: int, label: str = "srv", drop: tuple[str, ...] = ()) -> Trace:
    """A snapshot as a live window gives it: the rows of the trace's first ``k`` requests (all of
    a table without request ids), in memory, under the label ``label``."""
    ids = sorted(set(t.table("tokens").column("request_id").to_pylist()))[:k]
    keep = pa.array(ids, pa.string())
    tables = {}
    for name, table in t.tables.items():
        if name in drop:
            continue
        if "request_id" in table.column_names:
            table = table.filter(pc.is_in(table.column("request_id"), value_set=keep))
        tables[name] = table
    return Trace(path=Path(label), meta=dict(t.meta), tables=tables)


def _doc(a: object) -> str:
    doc = a.to_json()  # type: ignore[attr-defined]
    return json.dumps(doc, sort_keys=True)


@pytest.mark.parametrize("sample", ["chat", "queueing", "slow-tokenizer"])
def test_growing_snapshots_analyse_as_on_a_fresh_connection(sample: str) -> None:
    full = open_trace(SAMPLES / sample)
    n = len(set(full.table("tokens").column("request_id").to_pylist()))
    session = Session()
    sizes = sorted({max(1, n // 4), max(1, n // 2), n, max(1, n // 3)})
    for k in sizes:
        snap = _first_requests(full, k)
        assert _doc(analyze(snap, session=session, claims=["network", "tokenizer"])) == \
            _doc(analyze(snap, claims=["network", "tokenizer"]))
    assert session.opened == 1 and session.reused == len(sizes) - 1


def test_a_table_that_appears_or_goes_is_analysed_right() -> None:
    full = open_trace(SAMPLES / "chat")
    session = Session()
    for snap in (_first_requests(full, 3, drop=("steps",)), _first_requests(full, 4),
                 _first_requests(full, 5, drop=("steps", "clock_offsets"))):
        assert _doc(analyze(snap, session=session)) == _doc(analyze(snap))
    assert session.opened + session.reused == 3


def test_other_labels_or_options_open_a_fresh_connection() -> None:
    full = open_trace(SAMPLES / "chat")
    session = Session()
    a = analyze(_first_requests(full, 3, label="one"), session=session)
    b = analyze(_first_requests(full, 3, label="two"), session=session)
    c = analyze(_first_requests(full, 3, label="two"), session=session, claims=["network"])
    assert session.opened == 3 and session.reused == 0
    assert a.label == "one" and b.label == "two"
    assert {r["trace"] for r in b.rows("attribution_requests")} == {"two"}
    assert c.rows("claims") and not b.rows("claims")


def test_several_traces_combined_in_a_session() -> None:
    chat, queue = open_trace(SAMPLES / "chat"), open_trace(SAMPLES / "queueing")
    session = Session()
    for k in (2, 4):
        snaps = [_first_requests(chat, k, label="a"), _first_requests(queue, k, label="b")]
        assert _doc(analyze(snaps, per_trace=False, session=session)) == _doc(analyze(snaps, per_trace=False))
    assert session.reused == 1


def test_a_shown_analysis_queries_under_the_sessions_lock() -> None:
    """The TUI queries the analysis on screen while the next snapshot refreshes the session."""
    full = open_trace(SAMPLES / "chat")
    session = Session()
    shown = analyze(_first_requests(full, 2), session=session)
    errors: list[BaseException] = []

    def refresh() -> None:
        try:
            for k in (3, 4, 5, 6):
                analyze(_first_requests(full, k), session=session)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=refresh)
    t.start()
    counts = []
    while t.is_alive():
        counts.append(shown.query("SELECT count(*) AS n FROM attribution_requests").column("n")[0].as_py())
    t.join()
    assert not errors
    # a query sees a whole snapshot, never a half-refreshed one (2..6 requests, nothing else)
    assert set(counts) <= {2, 3, 4, 5, 6}
    assert shown.query("SELECT count(*) AS n FROM attribution_requests").column("n")[0].as_py() == 6


def test_a_table_outside_v1_that_goes_is_not_left_registered() -> None:
    full = open_trace(SAMPLES / "chat")
    session = Session()
    extra = _first_requests(full, 3)
    extra.tables["custom_metrics"] = pa.table({"x": [1, 2, 3]})
    a = analyze(extra, session=session)
    assert a.query("SELECT count(*) AS n FROM _t0_custom_metrics").column("n")[0].as_py() == 3
    b = analyze(_first_requests(full, 4), session=session)
    assert session.reused == 1
    with pytest.raises(Exception, match="custom_metrics"):
        b.query("SELECT count(*) FROM _t0_custom_metrics")


def test_analyses_of_one_session_compare_by_identity() -> None:
    """The TUI's reactive snapshot compares the new one with the one shown: two analyses on the
    same connection must not recurse through ``traces`` (which holds the analysis itself)."""
    full = open_trace(SAMPLES / "chat")
    session = Session()
    a = analyze(_first_requests(full, 3), session=session)
    b = analyze(_first_requests(full, 3), session=session)
    assert a.con is b.con
    assert a != b and a == a


def test_a_session_without_the_tail_gives_the_rest_unchanged(tmp_path: Path) -> None:
    """``Session(tail=False)`` (a live view's ticks): the tail's modules do not run, so the tail is null and
    no tail finding fires, from the first snapshot on; every other figure is a fresh analysis's."""
    from tail_scenarios import queue_bursts

    trace = open_trace(queue_bursts(tmp_path / "q", n=300).path)
    fresh = analyze(trace).to_json()
    assert fresh["tail"] is not None and any(f["id"].startswith("tail-") for f in fresh["findings"])
    session = Session(tail=False)
    for _ in range(2):  # the snapshot that opens the session, then one that reuses it
        doc = analyze(trace, session=session).to_json()
        assert doc["tail"] is None
        assert not any(f["id"].startswith("tail-") for f in doc["findings"])
        assert _without_tail(doc) == _without_tail(fresh)
        assert doc["findings"] == [f for f in fresh["findings"] if not f["id"].startswith("tail-")]
    assert session.reused == 1


def _without_tail(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in ("tail", "findings", "traces")}


def test_without_the_tail_its_tables_are_made_empty_with_their_columns(tmp_path: Path) -> None:
    """The connection a tail-less session opens creates the tail's data tables from ``LIMIT 0`` of their
    queries (DuckDB runs none of them): no rows, the columns and types a full analysis gives them, so the
    modules after them and the session's prepared refreshes bind the same; every other statement as is."""
    from tail_scenarios import queue_bursts

    from analyzers.connection import _open
    from analyzers.modules import script, tail_tables
    from analyzers.params import Thresholds

    full, empty = script(), script(frozenset({"no_tail"}))
    assert full.count(";\n") == empty.count(";\n") and empty.count(") LIMIT 0;\n") == len(tail_tables())
    assert [s for s in empty.split(";\n") if "LIMIT 0" not in s] == \
        [s for s in full.split(";\n") if not any(f"TEMP TABLE {t} AS" in s for t in tail_tables())]
    trace = open_trace(queue_bursts(tmp_path / "q", n=300).path)
    kw = {"roofline": None, "thresholds": Thresholds(), "claims": (), "labels": None}
    with_tail, without = _open([trace], **kw)[0], _open([trace], tail=False, **kw)[0]
    for table in sorted(tail_tables()):
        assert without.execute(f"DESCRIBE {table}").fetchall() == with_tail.execute(f"DESCRIBE {table}").fetchall()
        assert without.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
    assert with_tail.execute("SELECT count(*) FROM tail_requests").fetchone() != (0,)
