"""A dataset of many small traces (the fleet layout: one trace per server per hour).

Above ``STACK_TRACES`` traces each table is read as one relation with a ``trace`` column
(Arrow streams stacked, Parquet files in one multi-file scan) instead of a view per trace:
the analysis must not change. Compared here against each member analysed alone, against
the per-trace union the few-traces path builds, and the shape of an error about many traces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
from analyzer_scenarios import Req, scenario
from test_dataset import _GROUP_ONLY, _analysis_fields, same

import analyzers.connection as connection
from analyzers.analysis import analyze, named
from analyzers.fleet import analyze_dataset
from tracetool.errors import BadInput
from tracetool.reader import open_trace

SERVERS, HOURS = 3, 6


def small_fleet(root: Path) -> Path:
    """18 traces ``server=sN/hour=HH`` of 2-3 requests each; every other one as Parquet (read lazily)."""
    for s in range(SERVERS):
        for h in range(HOURS):
            d = root / f"server=s{s}" / f"hour={h:02d}"
            scenario(d, [Req(start=i * 300, network=5 + 40 * s, queue=20 * h, prefill=30, output=6 + h + i,
                             itl=15 + s) for i in range(2 + (h % 2))])
            if (s + h) % 2:
                t = open_trace(d)
                for name, table in t.tables.items():
                    (d / f"{name}.arrows").unlink()
                    pq.write_table(table, d / f"{name}.parquet")
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = small_fleet(tmp_path_factory.mktemp("many") / "fleet")
    assert SERVERS * HOURS > connection.STACK_TRACES  # the stacked path is the one under test
    return root, analyze_dataset([root]).to_json()


def test_each_trace_and_each_group_is_what_it_is_alone(dataset: tuple[Path, dict[str, Any]]) -> None:
    _, doc = dataset
    assert doc["dataset"]["traces"] == SERVERS * HOURS and len(doc["traces"]) == SERVERS * HOURS
    assert [g["server"] for g in doc["groups"]] == ["s0", "s1", "s2"]
    for t in (doc["traces"][0], doc["traces"][7], doc["traces"][-1]):  # an Arrow one and Parquet ones
        alone = analyze_dataset([t["path"]]).to_json()
        own = {k: v for k, v in t.items() if k not in {"trace", "path", "keys", "warnings"}}
        same(own, _analysis_fields(alone), t["trace"])
    g = doc["groups"][1]
    # labelled as in the dataset: the tail's replica feature is the label's first segment
    together = analyze([open_trace(p) for p in g["paths"]], per_trace=False, labels=g["traces"]).to_json()
    body = {k: v for k, v in g.items() if k not in _GROUP_ONLY | {"warnings"}}
    same(body, _analysis_fields(together), "group s1")
    assert doc["requests"] == sum(x["requests"] for x in doc["groups"])


def test_the_stacked_relation_analyses_as_the_union_of_views(dataset: tuple[Path, dict[str, Any]],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    root, doc = dataset
    paths = sorted(p.parent for p in root.rglob("meta.json"))
    traces = [open_trace(p, lazy=True) for p in paths]
    assert any(t.lazy for t in traces) and any(t.tables for t in traces)
    labels = [str(p.relative_to(root)) for p in paths]
    stacked = analyze(traces, per_trace=False, labels=labels)
    # one relation per table (the Arrow ones stacked, the Parquet ones in one scan), none per trace
    assert stacked.query("SELECT count(DISTINCT trace) FROM _all_tokens").column(0)[0].as_py() == 9
    assert stacked.query("SELECT count(DISTINCT trace) FROM _lazy_files").column(0)[0].as_py() == 9
    with pytest.raises(duckdb.CatalogException):
        stacked.query("SELECT * FROM _t0_tokens")
    monkeypatch.setattr(connection, "STACK_TRACES", 10_000)
    union = analyze(traces, per_trace=False, labels=labels)
    assert union.query("SELECT count(*) FROM _t0_tokens").column(0)[0].as_py() > 0
    same(stacked.to_json(), union.to_json())
    same(_analysis_fields(stacked.to_json()), _analysis_fields(doc))


def test_an_error_about_many_traces_names_their_count_and_three(dataset: tuple[Path, dict[str, Any]],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = dataset

    def out_of_memory(*_: Any, **__: Any) -> None:
        raise duckdb.OutOfMemoryException("Out of Memory Error: failed to allocate data of size 16.0 MiB")

    monkeypatch.setattr(connection, "run_all", out_of_memory)
    with pytest.raises(BadInput) as e:
        analyze_dataset([root])
    line = str(e.value)
    assert "\n" not in line and len(line) < 600, line
    assert line.startswith(f"{SERVERS * HOURS} traces (") and ", ...): cannot analyse (Out of Memory" in line
    assert sum(str(p.parent) in line for p in root.rglob("meta.json")) == 3


def test_named_lists_a_few_paths_whole_and_counts_many() -> None:
    assert named(["a", "b"]) == "a, b"
    many = named(f"/data/server=s{i:04d}/hour=01" for i in range(2000))
    assert many == "2,000 traces (/data/server=s0000/hour=01, /data/server=s0001/hour=01, " \
                   "/data/server=s0002/hour=01, ...)"

