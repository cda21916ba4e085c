"""Datasets: a tree of traces with key=value folders, analysed overall and per group.

The core promise: a group's numbers are what ``analyze`` gives on that group's traces
alone, compared field by field over whole JSON documents.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from analyzer_scenarios import H100_META, LLAMA_8B_META, Req, scenario

#: Fields of a group entry that are not the analysis' own.
_GROUP_ONLY = {"group", "traces", "paths", "server", "hour"}
#: Fields that name traces or paths, which differ between a dataset and a run over a sub-tree.
_NAMING = {"traces", "warnings", "dataset", "groups", "format", "version", "sql_engine"}


def _step(kv: int) -> float:
    return 8.0 + kv / 1000


def fleet(root: Path) -> Path:
    """Three servers: a (two hours, decode-bound), b (queueing), c (network-heavy, one hour)."""
    meta = {"model": LLAMA_8B_META, "hardware": H100_META}
    scenario(root / "server=a" / "hour=10", [Req(start=i * 400, network=5, prefill=30, output=40, itl=20,
                                                 step=_step, batch=4) for i in range(4)], **meta)
    scenario(root / "server=a" / "hour=11", [Req(start=i * 300, network=5, prefill=35, output=60, itl=22,
                                                 step=_step, batch=4) for i in range(3)], **meta)
    scenario(root / "server=b" / "hour=10", [Req(start=i * 500, network=5, queue=2500, prefill=30, output=12,
                                                 itl=20) for i in range(3)])
    scenario(root / "server=c" / "hour=10", [Req(start=i * 900, network=400, prefill=30, output=8, itl=15)
                                             for i in range(2)])
    return root


def _analysis_fields(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in _NAMING}


def same(a: Any, b: Any, where: str = "") -> None:
    """Equal, floats to 1e-12 relative: sums over traces come in DuckDB's parallel order."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert list(a) == list(b), where
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-12), where
    else:
        assert a == b, where


def test_three_servers_groups_equal_single_analyses(cli: Any, tmp_path: Path) -> None:
    ds = fleet(tmp_path / "fleet")
    r = cli("analyze", "--json", ds)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["dataset"] == {"keys": ["server", "hour"], "group_by": ["server"], "traces": 4, "bad_traces": []}
    assert [g["server"] for g in doc["groups"]] == ["a", "b", "c"]
    assert [g["traces"] for g in doc["groups"]] == [["server=a/hour=10", "server=a/hour=11"],
                                                    ["server=b/hour=10"], ["server=c/hour=10"]]
    assert [g["bottleneck"] for g in doc["groups"]] == ["decode", "queue", "network"]
    assert doc["requests"] == sum(g["requests"] for g in doc["groups"]) == 12
    for g in doc["groups"]:
        alone = json.loads(cli("analyze", "--json", *g["paths"]).out)
        body = {k: v for k, v in g.items() if k not in _GROUP_ONLY}
        assert body.pop("warnings") == alone["warnings"]
        same(body, _analysis_fields(alone), g["server"])
    # each trace carries its keys
    assert doc["traces"][0]["keys"] == {"server": "a", "hour": "10"}


def test_group_by_two_keys_and_by_the_inner_key(cli: Any, tmp_path: Path) -> None:
    ds = fleet(tmp_path / "fleet")
    doc = json.loads(cli("analyze", "--json", "--group-by", "hour", ds).out)
    assert [(g["hour"], len(g["traces"])) for g in doc["groups"]] == [("10", 3), ("11", 1)]
    hour10 = json.loads(cli("analyze", "--json", *doc["groups"][0]["paths"]).out)
    same({k: v for k, v in doc["groups"][0].items() if k not in _GROUP_ONLY | {"warnings"}},
         _analysis_fields(hour10))
    both = json.loads(cli("analyze", "--json", "--group-by", "server,hour", ds).out)
    assert [g["group"] for g in both["groups"]] == [{"server": "a", "hour": "10"}, {"server": "a", "hour": "11"},
                                                   {"server": "b", "hour": "10"}, {"server": "c", "hour": "10"}]
    text = cli("analyze", "--group-by", "server", ds).out
    assert "group (server)" in text and "4 traces" in text


def test_unknown_group_key_is_a_usage_error(cli: Any, tmp_path: Path) -> None:
    r = cli("analyze", "--group-by", "region", fleet(tmp_path / "fleet"))
    assert r.code == 2 and "region" in r.err and "server, hour" in r.err and r.out == ""


def test_broken_trace_among_good_ones(cli: Any, tmp_path: Path) -> None:
    ds = fleet(tmp_path / "fleet")
    bad = ds / "server=d" / "hour=10"
    bad.mkdir(parents=True)
    (bad / "meta.json").write_text('{"format": "tracetool", "version": 1}')
    (bad / "tokens.arrows").write_bytes(b"not arrow at all, a torn copy")
    r = cli("analyze", "--json", ds)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["requests"] == 12 and [g["server"] for g in doc["groups"]] == ["a", "b", "c"]
    assert [b["path"] for b in doc["dataset"]["bad_traces"]] == [str(bad)]
    assert f"tracetool: {bad}: skipped:" in r.err and "tokens.arrows" in r.err
    strict = cli("analyze", "--json", "--strict", ds)
    assert strict.code == 1 and json.loads(strict.out)["requests"] == 12 and str(bad) in strict.err


def test_trace_with_no_request_among_good_ones_is_set_aside(cli: Any, tmp_path: Path) -> None:
    """An empty recording (attach --record of a server that was not reachable) is a bad trace of the
    dataset, with its reason, not the end of the whole analysis."""
    from tracetool.writer import TraceWriter

    ds = fleet(tmp_path / "fleet")
    empty = ds / "server=d" / "hour=10"
    TraceWriter(empty, meta={}).start().close()
    r = cli("analyze", "--json", ds)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["requests"] == 12 and [g["server"] for g in doc["groups"]] == ["a", "b", "c"]
    assert doc["dataset"]["bad_traces"] == [
        {"path": str(empty), "error": "nothing to analyse: the trace has neither a spans nor a tokens table "
                                      "(tables: none)"}]
    assert f"tracetool: {empty}: skipped: nothing to analyse" in r.err
    alone = cli("analyze", empty)  # named on its own, it is still an error
    assert alone.code == 3 and "nothing to analyse" in alone.err


def test_mixed_versions_are_refused_in_one_line(cli: Any, tmp_path: Path) -> None:
    ds = fleet(tmp_path / "fleet")
    newer = ds / "server=c" / "hour=11"
    newer.mkdir()
    (newer / "meta.json").write_text('{"format": "tracetool", "version": 2}')
    r = cli("analyze", ds)
    assert r.code == 3 and r.out == ""
    assert r.err.count("\n") == 1 and "mixes trace versions" in r.err and "version 2" in r.err


def test_every_trace_broken_exits_3(cli: Any, tmp_path: Path) -> None:
    one = tmp_path / "ds" / "server=a"
    one.mkdir(parents=True)
    (one / "meta.json").write_text("{not json")
    r = cli("analyze", tmp_path / "ds")
    assert r.code == 3 and "meta.json" in r.err and r.err.count("\n") == 1


def test_convert_dataset_writes_sorted_zstd_parquet_that_analyses_the_same(cli: Any, tmp_path: Path) -> None:
    ds = fleet(tmp_path / "fleet")
    out = tmp_path / "parquet"
    r = cli("convert", "--dataset", ds, "-o", out)
    assert r.code == 0, r.err
    assert "4 traces" in r.out
    tokens = out / "server=a" / "hour=11" / "tokens.parquet"
    md = pq.ParquetFile(tokens).metadata
    assert md.row_group(0).column(0).compression == "ZSTD"
    t = pq.read_table(tokens)
    keys = list(zip(t["request_id"].to_pylist(), t["index"].to_pylist(), strict=True))
    assert keys == sorted(keys)
    before = json.loads(cli("analyze", "--json", ds).out)
    after = json.loads(cli("analyze", "--json", out).out)
    same(_analysis_fields(after), _analysis_fields(before))
    for g0, g1 in zip(before["groups"], after["groups"], strict=True):
        strip = _GROUP_ONLY | {"warnings"}
        same({k: v for k, v in g1.items() if k not in strip}, {k: v for k, v in g0.items() if k not in strip})
    # not into a non-empty directory without --force
    again = cli("convert", "--dataset", ds, "-o", out)
    assert again.code == 2 and "--force" in again.err


def test_convert_dataset_names_the_trace_it_could_not_read(cli: Any, tmp_path: Path) -> None:
    ds = fleet(tmp_path / "fleet")
    bad = ds / "server=d"
    bad.mkdir()
    (bad / "meta.json").write_text('{"format": "tracetool", "version": 1}')
    (bad / "spans.arrows").write_bytes(b"")
    (bad / "tokens.arrows").write_bytes(b"garbage")
    r = cli("convert", "--dataset", ds, "-o", tmp_path / "out")
    assert r.code == 3 and f"{bad}: not converted" in r.err
    assert (tmp_path / "out" / "server=c" / "hour=10" / "tokens.parquet").is_file()


@pytest.mark.parametrize("fmt", ["json", "md"])
def test_report_accepts_a_dataset(cli: Any, tmp_path: Path, fmt: str) -> None:
    ds = fleet(tmp_path / "fleet")
    r = cli("report", "--format", fmt, ds)
    assert r.code == 0, r.err
    if fmt == "json":
        doc = json.loads(r.out)
        assert doc["trace"]["requests"] == 12
        assert doc["bottleneck"] == json.loads(cli("analyze", "--json", ds).out)["bottleneck"]
    else:
        assert "12" in r.out


def test_every_reader_of_a_directory_of_traces_takes_a_tree(tmp_path: Path) -> None:
    """The TUI's file source and the Python API expand a dataset at any depth, bookkeeping folders skipped."""
    import analyzers
    from tracetool.reader import find_traces
    from tracetool.trace_source import DirectorySource

    ds = fleet(tmp_path / "fleet")
    (ds / "_spark_metadata" / "x").mkdir(parents=True)
    (ds / "_spark_metadata" / "x" / "meta.json").write_text("{}")
    found = find_traces([ds])
    assert [p.relative_to(ds).as_posix() for p in found] == ["server=a/hour=10", "server=a/hour=11",
                                                           "server=b/hour=10", "server=c/hour=10"]
    assert len(DirectorySource([ds]).open()) == 4
    assert analyzers.analyze(ds).to_json()["requests"] == 12
