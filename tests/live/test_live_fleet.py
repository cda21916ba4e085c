"""A live fleet and an offline dataset look alike.

``tracetool attach ADDR... --record DIR`` writes ``DIR/server=HOST:PORT/``, a dataset
``analyze`` groups per server; ``tracetool attach ADDR... --json --duration S`` prints
one document of the same shape from the servers' live windows. Real recorders stream
over real loopback endpoints (the ``live_recorder`` fixture); the CLI runs in-process,
or as a process where a signal is sent.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from live_helpers import (
    Traffic,
    endpoint_holds_what_was_written,
    free_port,
    history_sent,
    produce,
    stop_process,
    wait_until,
)

from collectors.recorder import Recorder
from tracetool.dataset import hive_keys
from tracetool.live.config import LiveConfig
from tracetool.live.headless import server_folder
from tracetool.live.protocol import Address

#: Fields of a group entry that are not the analysis' own.
_GROUP_ONLY = {"server", "group", "traces", "paths"}


def _quiet_fleet(live_recorder: Callable[..., Recorder]) -> tuple[list[Recorder], list[int]]:
    """Three servers that served 3, 5 and 7 requests (of 5, 10 and 15 tokens) and are now quiet:
    their whole traces are in their recent history, so a live window and a recording hold the
    same rows."""
    recs, served = [], []
    for i, name in enumerate("abc"):
        rec = live_recorder(name)
        produce(rec, 3 + 2 * i, 5 + 5 * i, prefix=f"{name}-")
        recs.append(rec)
        served.append(3 + 2 * i)
    return recs, served


def _shape(doc: Any) -> Any:
    """The document's keys, recursively (lists by their first element): its shape, not its values."""
    if isinstance(doc, dict):
        return {k: _shape(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_shape(doc[0])] if doc else []
    return None


def _body(group: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k not in _GROUP_ONLY}


@pytest.mark.slow
def test_live_fleet_document_has_the_offline_datasets_shape_and_numbers(
        live_recorder: Callable[..., Recorder], tmp_path: Path, cli) -> None:
    recs, served = _quiet_fleet(live_recorder)
    addrs = [str(r.live.address) for r in recs]

    live = cli("attach", *addrs, "--json", "--duration", "2")
    assert live.code == 0, live.err
    assert "Traceback" not in live.err and "watching" in live.err
    ldoc = json.loads(live.out)

    out = tmp_path / "fleet"
    rec = cli("attach", *addrs, "--record", out, "--duration", "2")
    assert rec.code == 0, rec.err
    assert sorted(p.name for p in out.iterdir()) == sorted(f"server={a}" for a in addrs)
    off = cli("analyze", out, "--json")  # no --group-by: the outermost key, server
    assert off.code == 0, off.err
    odoc = json.loads(off.out)

    # offline: one group per server, keyed by its address, each what analyze gives on that trace alone
    assert odoc["dataset"] == {"keys": ["server"], "group_by": ["server"], "traces": 3, "bad_traces": []}
    assert sorted(g["server"] for g in odoc["groups"]) == sorted(addrs)
    for g in odoc["groups"]:
        assert g["group"] == {"server": g["server"]} and g["traces"] == [f"server={g['server']}"]
        alone = json.loads(cli("analyze", "--json", *g["paths"]).out)
        assert _body(g) == {k: v for k, v in alone.items()
                            if k not in ("format", "version", "traces", "sql_engine", "dataset", "groups")}

    # live: the same document, key for key: top level, dataset, groups and their fields
    assert ldoc["dataset"] == odoc["dataset"]
    assert ldoc["sql_engine"] == odoc["sql_engine"] == "duckdb"
    assert _shape({k: v for k, v in ldoc.items() if k != "groups"}) == _shape(
        {k: v for k, v in odoc.items() if k != "groups"})
    assert [list(g) for g in ldoc["groups"]] == [list(odoc["groups"][0])] * 3
    assert [g["server"] for g in ldoc["groups"]] == addrs, "one group per server, in the order given"
    by_server = {g["server"]: g for g in odoc["groups"]}
    for g, n in zip(ldoc["groups"], served, strict=True):
        o = by_server[g["server"]]
        assert g["requests"] == n, "each server's group holds what it served"
        assert (g["group"], g["traces"], g["paths"]) == ({"server": g["server"]}, o["traces"], [g["server"]])
        # the quiet servers' windows hold the rows the recordings hold: the numbers are equal
        assert _body(g) == _body(o), g["server"]
    assert ldoc["requests"] == odoc["requests"] == sum(served)
    assert {k: v for k, v in ldoc.items() if k not in ("traces", "groups")} == \
        {k: v for k, v in odoc.items() if k not in ("traces", "groups")}


@pytest.mark.slow
def test_unreachable_server_is_a_bad_trace_and_the_others_are_analysed(
        live_recorder: Callable[..., Recorder], tmp_path: Path, cli) -> None:
    a, b = live_recorder("a"), live_recorder("b")
    produce(a, 2, 5, prefix="a-")
    produce(b, 4, 5, prefix="b-")
    nobody = f"127.0.0.1:{free_port()}"
    with Traffic(a, tokens=5):  # a serves while watched: its window grows
        r = cli("attach", str(a.live.address), nobody, str(b.live.address), "--json", "--duration", "2",
                "--connect-timeout", "1")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["dataset"]["traces"] == 2
    [bad] = doc["dataset"]["bad_traces"]
    assert bad["path"] == nobody and bad["error"].startswith("not reachable")
    assert f"tracetool: {nobody}: skipped: not reachable" in r.err
    groups = {g["server"]: g for g in doc["groups"]}
    assert list(groups) == [str(a.live.address), str(b.live.address)]
    assert groups[str(a.live.address)]["requests"] > 2 and groups[str(b.live.address)]["requests"] == 4
    assert doc["requests"] == sum(g["requests"] for g in doc["groups"])

    # the same servers recorded: the unreachable one's empty trace is set aside the same way
    out = tmp_path / "rec"
    rec = cli("attach", str(a.live.address), nobody, str(b.live.address), "--record", out, "--duration", "2")
    assert rec.code == 3 and "nothing recorded" in rec.err
    off = cli("analyze", out, "--json")
    assert off.code == 0, off.err
    odoc = json.loads(off.out)
    assert [x["path"] for x in odoc["dataset"]["bad_traces"]] == [str(out / f"server={nobody}")]
    assert sorted(g["server"] for g in odoc["groups"]) == sorted(groups)


def test_live_json_errors_are_one_line_with_exit_codes(live_recorder: Callable[..., Recorder], cli) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    r = cli("attach", nobody, "--json")
    assert r.code == 2 and "--duration" in r.err and r.out == ""
    r = cli("attach", nobody, "--duration", "1")
    assert r.code == 2 and "--record DIR" in r.err and "--json" in r.err
    r = cli("attach", nobody, nobody, "--json", "--duration", "1")
    assert r.code == 2 and "given twice" in r.err
    r = cli("attach", nobody, "--json", "--duration", "0.5", "--connect-timeout", "0.5")
    assert r.code == 3 and r.out == "" and "nothing to analyse" in r.err and nobody in r.err
    assert r.err.count("\n") == 2 and "Traceback" not in r.err  # the "watching" line, then the error
    rec = live_recorder(live=LiveConfig("127.0.0.1:0", token="right"))
    produce(rec, 2, 5)
    r = cli("attach", str(rec.live.address), "--token", "wrong", "--json", "--duration", "5")
    assert r.code == 3 and r.out == "" and "refused: wrong token" in r.err


def test_server_folder_reads_back_as_the_address() -> None:
    for a in (Address("127.0.0.1", 9100), Address("fe80::1%eth0", 9100), Address("host/x", 1)):
        folder = server_folder(a)
        assert "/" not in folder and folder.startswith("server=")
        assert hive_keys([folder]) == (("server", str(a)),)
    assert server_folder(Address("10.0.0.5", 9100)) == "server=10.0.0.5:9100"


@pytest.mark.slow
def test_ctrl_c_prints_what_was_watched_and_exits_130(live_recorder: Callable[..., Recorder]) -> None:
    rec = live_recorder()
    produce(rec, 3, 5, prefix="before")
    rec.writer.flush()
    wait_until(lambda: endpoint_holds_what_was_written(rec), "the endpoint holding the three requests")
    p = subprocess.Popen([sys.executable, "-m", "tracetool", "attach", str(rec.live.address), "--json",
                          "--duration", "600"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # sent: the viewer's readers took it, and watch_live stops them before it reads their windows
    wait_until(lambda: history_sent(rec), "the viewer's connection and its history sent")
    stdout, stderr = stop_process(p, signal.SIGINT)
    assert p.returncode == 130, stderr
    assert "Traceback" not in stderr
    doc = json.loads(stdout)
    assert [(g["server"], g["requests"]) for g in doc["groups"]] == [(str(rec.live.address), 3)]


def test_window_options_apply_to_the_live_document(live_recorder: Callable[..., Recorder], cli) -> None:
    rec = live_recorder()
    produce(rec, 5, 4, prefix="w")
    r = cli("attach", str(rec.live.address), "--json", "--duration", "2", "--window-requests", "2")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["requests"] == 2 and [g["requests"] for g in doc["groups"]] == [2]
    assert "last 2 requests" in r.err
