"""``tracetool attach ADDR --record DIR --duration S``: the live stream saved as a valid v1 trace."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from live_helpers import Traffic, free_port, produce, recorded_rows, stop_process, wait_until

from collectors.recorder import Recorder
from tracetool.live.config import LiveConfig
from tracetool.reader import open_trace


@pytest.mark.slow
def test_record_saves_a_valid_trace_that_says_where_it_came_from(
        live_recorder: Callable[..., Recorder], tmp_path: Path, cli) -> None:
    rec = live_recorder(meta={"model": {"name": "demo", "params": 1000}})
    produce(rec, 3, 10, prefix="before")  # history: recorded before the attach
    out = tmp_path / "copy"
    with Traffic(rec, tokens=10):
        r = cli("attach", str(rec.live.address), "--record", str(out), "--duration", "1.5", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    server = doc["servers"][0]
    assert server["connected"] and server["rows"]["tokens"] >= 30 and server["dropped_rows"] == {}
    assert "recorded" in r.err and "Traceback" not in r.err
    v = cli("validate", str(out))
    assert v.code == 0, v.out + v.err
    t = open_trace(out)
    assert t.meta["closed"] is True
    assert t.meta["model"] == {"name": "demo", "params": 1000}, "the server's meta fields are kept"
    assert any(f"recorded by tracetool attach from {rec.live.address}" in n for n in t.meta["notes"])
    assert t.meta["live_source"]["address"] == str(rec.live.address)
    assert t.meta["live_source"]["instances"] == [rec.live.instance]
    assert t.rows("tokens") == server["rows"]["tokens"]
    assert {"before0", "before1", "before2"} <= set(t.table("tokens").column("request_id").to_pylist())
    a = cli("analyze", str(out), "--json")
    assert a.code == 0 and json.loads(a.out)["requests"] >= 3


def test_stream_drops_are_in_the_trace_meta(live_recorder: Callable[..., Recorder], tmp_path: Path) -> None:
    from tracetool.live.client import ClientOptions
    from tracetool.live.headless import _finish, _Recorder

    rec = live_recorder()
    r = _Recorder(rec.live.address, tmp_path / "t", ClientOptions())
    r.writer.start()
    r.conn._dropped_before = {"tokens": 77}  # what the server reported for this viewer
    _finish(r, 1.0, ClientOptions())
    t = open_trace(tmp_path / "t")
    assert t.meta["dropped_rows"] == {"tokens": 77}
    assert any("dropped 77 rows" in n for n in t.meta["notes"])


@pytest.mark.slow
def test_record_several_servers_one_trace_each(live_recorder: Callable[..., Recorder], tmp_path: Path, cli) -> None:
    a, b = live_recorder("a"), live_recorder("b")
    produce(a, 2, 5, prefix="a")
    produce(b, 2, 5, prefix="b")
    out = tmp_path / "both"
    r = cli("attach", str(a.live.address), str(b.live.address), "--record", str(out), "--duration", "1", "--json")
    assert r.code == 0, r.err
    dirs = sorted(p.name for p in out.iterdir())
    assert dirs == sorted(f"server=127.0.0.1:{x.live.address.port}" for x in (a, b))
    summary = json.loads(r.out)["servers"]
    assert [(s["directory"], s["keys"]) for s in summary] == [
        (str(out / f"server={x.live.address}"), {"server": str(x.live.address)}) for x in (a, b)]
    assert f"tracetool analyze {out}" in r.err
    assert cli("validate", str(out / dirs[0])).code == 0
    doc = json.loads(cli("analyze", str(out), "--json").out)
    # a dataset keyed by server: grouped per server with no --group-by, the key read back as the address
    assert doc["dataset"]["group_by"] == ["server"]
    assert sorted((g["server"], g["requests"]) for g in doc["groups"]) == sorted(
        (str(x.live.address), 2) for x in (a, b))


def test_record_errors_are_one_line_with_exit_codes(live_recorder: Callable[..., Recorder], tmp_path: Path,
                                                    cli) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    r = cli("attach", nobody, "--record", str(tmp_path / "n"), "--duration", "0.5")
    assert r.code == 3 and "nothing recorded" in r.err and "Traceback" not in r.err
    rec = live_recorder(live=LiveConfig("127.0.0.1:0", token="right"))
    r = cli("attach", str(rec.live.address), "--token", "wrong", "--record", str(tmp_path / "w"), "--duration", "1")
    assert r.code == 3 and "refused: wrong token" in r.err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    r = cli("attach", str(rec.live.address), "--record", str(tmp_path / "full"), "--duration", "1")
    assert r.code == 2 and "not empty" in r.err
    assert cli("attach", "127.0.0.1:1", "--record", str(tmp_path / "d")).code == 2
    assert cli("attach", "127.0.0.1:1", "--duration", "3").code == 2
    r = cli("attach", str(rec.live.address), str(rec.live.address), "--record", str(tmp_path / "twice"),
            "--duration", "1")
    assert r.code == 2 and "given twice" in r.err
    assert cli("attach", "host:99999").code == 2
    r = cli("attach", "127.0.0.1:1")  # the TUI needs a terminal; pytest has none
    assert r.code == 2 and "interactive terminal" in r.err


@pytest.mark.slow
def test_sigterm_ends_a_recording_saved_like_ctrl_c(live_recorder: Callable[..., Recorder], tmp_path: Path) -> None:
    """``kill``, ``timeout`` or a cancelled CI job sends SIGTERM: the recording stops early, saved
    (closed, every received row written), exit 130 as after Ctrl-C."""
    import signal
    import subprocess
    import sys
    import time

    rec = live_recorder()
    produce(rec, 3, 10, prefix="before")
    out = tmp_path / "copy"
    with Traffic(rec, tokens=10):
        p = subprocess.Popen([sys.executable, "-m", "tracetool", "attach", str(rec.live.address), "--record",
                              str(out), "--duration", "600", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_until(lambda: recorded_rows(out, "tokens") > 30, "the history and some live rows in the recording",
                   interval=0.1)
        t0 = time.monotonic()
        stdout, stderr = stop_process(p, signal.SIGTERM)
    assert time.monotonic() - t0 < 30, "SIGTERM did not end the recording promptly"
    assert p.returncode == 130, stderr
    assert "Traceback" not in stderr
    doc = json.loads(stdout)
    assert doc["interrupted"] is True
    t = open_trace(out)
    assert t.meta["closed"] is True
    assert t.rows("tokens") == doc["servers"][0]["rows"]["tokens"] >= 30


def test_record_with_metrics_url_scrapes_into_the_recording(live_recorder: Callable[..., Recorder],
                                                            tmp_path: Path, cli) -> None:
    from tests.serving.engine_metrics_server import EngineDouble

    rec = live_recorder()
    out = tmp_path / "copy"
    with EngineDouble("vllm") as engine, Traffic(rec, tokens=5):
        metrics = engine.url.removesuffix("/v1") + "/metrics"
        r = cli("attach", str(rec.live.address), "--record", str(out), "--duration", "0.5",
                "--metrics-url", metrics, "--metrics-interval", "0.1")
    assert r.code == 0, r.err
    t = open_trace(out)
    assert t.rows("server_metrics") > 0
    assert set(t.table("server_metrics").column("clock").to_pylist()) == {"scraper"}
    assert t.meta["server_metrics"]["scrapes"] >= 1 and t.meta["server_metrics"]["stopped"] is None
    assert cli("validate", str(out)).code == 0
    # without --record, or with several servers, there is no trace to put the samples in
    assert cli("attach", str(rec.live.address), "--metrics-url", metrics).code == 2
