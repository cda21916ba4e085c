"""The SQL behind the Decode, GPU/CPU, Requests screens and the read-only console, headless."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tracetool.tui.model import View
from tracetool.tui.queries import (
    SCREEN_THREADS,
    ConsoleRefused,
    check_readonly,
    decode_data,
    object_names,
    request_detail,
    request_table,
    run_console,
    sort_requests,
    system_data,
)


def test_decode_bins_follow_the_fit_basis(chat: Path, snap: Any) -> None:
    view = snap(chat).view(None)
    d = decode_data(view)
    fit = view.doc["decode"]["fit"]
    assert d.basis == "step" == fit["basis"]
    assert d.tokens == fit["n"] == 2672
    assert d.kv_range == (fit["kv_len_min"], fit["kv_len_max"])
    # Every binned ITL is one the analyzer measured (7.2-7.6 ms on this trace); p90 >= p50.
    assert all(7.0 < p50 <= p90 < 8.0 for _, p50, p90 in d.by_index)
    # The density cells sit on the fitted line: step = base + slope * kv_len (within a cell's height).
    cell = d.y_max / 96
    for kv, ms, n in d.density:
        assert n > 0 and abs(ms - (fit["base_ms"] + fit["per_1k_kv_ms"] * kv / 1000)) <= cell


def test_screen_queries_leave_a_core_to_the_app(chat: Path) -> None:
    """A screen's query (here the console's) runs on all cores but one, and the analysis gets its own
    setting back: a live view analyses its next snapshot on the same connection."""
    import analyzers

    a = analyzers.analyze(chat)
    view = View(a.label, a, a.to_json(), lock=a._lock)
    a.con.execute("SET threads = 4")
    assert run_console(view, "SELECT current_setting('threads')").rows[0][0] == min(4, SCREEN_THREADS)
    assert a.con.execute("SELECT current_setting('threads')").fetchall()[0][0] == 4
    a.release()


def test_system_data_aligns_gpu_with_decode_windows(chat: Path, snap: Any) -> None:
    view = snap(chat).view(None)
    s = system_data(view, buckets=400)
    assert s.buckets == 400 and set(s.gpu) == {"sm", "dram", "mem", "power"}
    sm, decode = s.gpu["sm"][0], s.decode
    busy = [v for v, d in zip(sm, decode, strict=True) if v is not None and d > 0.99]
    idle = [v for v, d in zip(sm, decode, strict=True) if v is not None and d == 0]
    # Inside decode windows the GPU is busy; after the last request it idles (before the first
    # token the GPU prefills, which is busy but outside every decode window).
    assert busy and min(busy) >= 90 and idle and idle[-1] <= 5
    assert next(iter(s.cpu)) == "model-forward"
    for b in range(s.buckets):
        if s.cpu_samples[b]:
            assert sum(shares[b] for shares in s.cpu.values()) == pytest.approx(1.0)


def test_system_data_is_empty_without_tables(xregion: Path, snap: Any) -> None:
    s = system_data(snap(xregion).view(None))
    assert s.buckets == 0 and not s.gpu and not s.cpu


def test_request_table_sorts_with_nulls_last(chat: Path, snap: Any) -> None:
    view = snap(chat).view(None)
    table = request_table(view)
    assert table.num_rows == 8 and table.column("itl_p50_ms").null_count == 0
    by_e2e = sort_requests(table, "e2e").column("e2e_ms").to_pylist()
    assert by_e2e == sorted(by_e2e, reverse=True)
    up = sort_requests(table, "ttft", descending=False).column("ttft_ms").to_pylist()
    assert up == sorted(up)
    assert sort_requests(table, "e2e", limit=3).num_rows == 3


def test_request_detail_has_spans_and_tokens(chat: Path, snap: Any) -> None:
    d = request_detail(snap(chat).view(None), "chat", "chat-02")
    names = [s["name"] for s in d.spans]
    assert names[0] == "client.request" and "server.request" in names and "decode" in names
    assert len(d.tokens) == 380 and d.tokens[0]["itl_ms"] is None
    assert d.tokens[1]["itl_clock"] == "client" and d.tokens[1]["step_ms"] is not None
    assert d.origin_ns == next(s["start_ns"] for s in d.spans if s["name"] == "server.request")
    assert d.row["request_id"] == "chat-02" and d.row["bottleneck"] == "decode"


def test_console_reads_tables_and_analyzer_views(chat: Path, snap: Any) -> None:
    view = snap(chat).view(None)
    r = run_console(view, "SELECT component, measured FROM attribution_components ORDER BY ordinal")
    assert r.columns == ["component", "measured"] and r.rows[:2] == [("client_queue", False), ("network", True)]
    assert not r.truncated
    r = run_console(view, "select count(*) from tokens;", max_rows=5)
    assert r.rows == [(2680,)]
    r = run_console(view, "FROM tokens", max_rows=5)
    assert len(r.rows) == 5 and r.truncated
    assert run_console(view, "DESCRIBE spans").rows[0][0] == "trace"
    names = object_names(view)
    assert {"spans", "tokens", "tokens_gaps", "attribution_requests", "findings", "claims"} <= set(names)
    for name in names:
        run_console(view, f"SELECT * FROM {name} LIMIT 1")


@pytest.mark.parametrize(("sql", "message"), [
    ("COPY tokens TO '{tmp}/out.csv'", "COPY statements are refused"),
    ("ATTACH '{tmp}/x.duckdb' AS x", "ATTACH statements are refused"),
    ("INSTALL httpfs", "INSTALL/LOAD statements are refused"),
    ("LOAD httpfs", "INSTALL/LOAD statements are refused"),
    ("SELECT * FROM read_csv('/etc/passwd')", "file system operations are disabled"),
    ("SELECT * FROM '{tmp}/out.csv'", "disabled"),
    ("CREATE TABLE t AS SELECT 1", "CREATE statements are refused"),
    ("CREATE TEMP VIEW v AS SELECT 1", "CREATE statements are refused"),
    ("INSERT INTO findings SELECT * FROM findings", "INSERT statements are refused"),
    ("DROP TABLE findings", "DROP statements are refused"),
    ("SET enable_external_access = true", "SET statements are refused"),
    ("EXPORT DATABASE '{tmp}/db'", "EXPORT statements are refused"),
    ("SELECT 1; SELECT 2", "one statement at a time"),
    ("SELEC 1", "Parser Error"),
    ("   ", "nothing to run"),
])
def test_console_refuses_writes_files_and_extensions(chat: Path, snap: Any, tmp_path: Path, sql: str,
                                                    message: str) -> None:
    view = snap(chat).view(None)
    with pytest.raises(ConsoleRefused, match=message) as info:
        run_console(view, sql.format(tmp=tmp_path))
    assert "\n" not in str(info.value) and "LINE 1" not in str(info.value)
    assert list(tmp_path.iterdir()) == [], "nothing was written"
    assert run_console(view, "SELECT count(*) FROM findings").rows[0][0] == len(view.doc["findings"])


def test_check_readonly_returns_the_statement(chat: Path, snap: Any) -> None:
    con = snap(chat).view(None).analysis.con
    assert check_readonly(con, "  select 42 ; ").strip().lower().startswith("select 42")
