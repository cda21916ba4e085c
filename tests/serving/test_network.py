"""Per-request network attribution end to end: plain loopback, a known added RTT, the join, a dying server."""

from __future__ import annotations

import signal
import statistics
import threading
from pathlib import Path

import pytest

from tests.serving.conftest import Server, network_ms, span_durations, wait_ready
from tests.waiting import wait_until
from tracetool.errors import TracetoolError
from tracetool.merge import merge_traces
from tracetool.reader import open_trace
from tracetool.serving.demo import server_process, stop_process
from tracetool.serving.probe import ProbeConfig, Prober, run_probe
from tracetool.serving.proxy import DelayProxy

pytestmark = pytest.mark.slow

RTT_MS = 200.0  # a cross-region round trip (docs/domain.md §1: 25-250 ms)


def probe(url: str, out: Path, n: int = 6, max_tokens: int = 8) -> None:
    res = run_probe(ProbeConfig(url=url, n=n, concurrency=2, prompt_tokens=24, max_tokens=max_tokens,
                                ignore_eos=True, progress=False, out=out))
    assert all(r.ok for r in res.results), [r.error for r in res.results if r.error]


def wait_for_ids(path: Path, ids: set[str], timeout_s: float = 30.0) -> None:
    """Until the running server's trace holds each request's row and its server.request span
    (the span ends after the last byte is sent, so it can land after the client is done)."""

    def done() -> set[str]:
        t = open_trace(path)
        spans = {r["request_id"] for r in t.table("spans").to_pylist() if r["name"] == "server.request"}
        return set(t.table("requests").column("request_id").to_pylist()) & spans

    wait_until(lambda: ids <= done(), "the server trace to hold the requests", timeout=timeout_s, interval=0.1)


def test_added_rtt_is_attributed_to_network(server: Server, tmp_path: Path) -> None:
    probe(server.url, tmp_path / "direct", max_tokens=16)
    host, port = "127.0.0.1", int(server.url.rsplit(":", 1)[1].split("/")[0])
    with DelayProxy((host, port), rtt_ms=RTT_MS) as proxy:
        probe(f"{proxy.url}/v1", tmp_path / "slow", max_tokens=16)
    direct = network_ms(open_trace(tmp_path / "direct"))
    slow = network_ms(open_trace(tmp_path / "slow"))
    assert len(direct) == len(slow) == 6  # every request had both spans (server timing folded in)
    # plain loopback: network is a small share of what the client waited, and far below the added
    # RTT (the share's bound leaves room for a loaded two-core machine, where the probe's and the
    # server's event loops wait for a core: 10.7 % and 11.7 % were seen under a 10 % bound)
    d = span_durations(open_trace(tmp_path / "direct"))
    share = sum(direct.values()) / sum(v["client.request"] / 1e6 for v in d.values())
    assert share < 0.25, f"loopback network share {share:.1%}"
    # the median: one request whose event loop waited for a core (90 ms and 38 ms beside 3-5 ms were
    # seen on a loaded two-core machine) must not pass for network, while an RTT on every request would
    assert statistics.median(direct.values()) < 0.1 * RTT_MS, direct
    # through the proxy: the added RTT shows up as network, within 20 %
    assert abs(statistics.mean(slow.values()) - RTT_MS) <= 0.2 * RTT_MS, slow
    assert all(v >= 0.8 * RTT_MS for v in slow.values())


def test_request_ids_join_100_percent(server: Server, tmp_path: Path, cli) -> None:
    probe(server.url, tmp_path / "client", n=5)
    ids = set(open_trace(tmp_path / "client").table("requests").column("request_id").to_pylist())
    wait_for_ids(server.trace, ids)
    rep = merge_traces(tmp_path / "client", server.trace, tmp_path / "joined")
    assert rep.client_requests == 5 and rep.joined == 5 and rep.client_only == 0
    t = open_trace(tmp_path / "joined")
    offsets = {r["request_id"]: r for r in t.table("clock_offsets").to_pylist()}
    assert set(offsets) == ids
    net = network_ms(t)
    for rid in ids:  # network in the joined trace is still the difference of durations
        assert offsets[rid]["network_ns"] / 1e6 == pytest.approx(net[rid], abs=1e-6)
        assert abs(offsets[rid]["offset_ns"]) < 50e6  # one host: the two clocks agree closely
    tokens = [r for r in t.table("tokens").to_pylist() if r["request_id"] in ids]
    assert tokens and all(r["client_recv_ns"] is not None for r in tokens if r["index"] == 0)
    assert all(r["client_recv_ns"] >= r["emit_ns"] - 50e6 for r in tokens if r["client_recv_ns"])
    r = cli("merge", tmp_path / "client", server.trace, "-o", tmp_path / "joined")
    assert r.code == 2 and "not empty" in r.err  # refuses to overwrite without --force
    r = cli("merge", tmp_path / "client", server.trace, "-o", tmp_path / "joined", "--force")
    assert r.code == 0 and "joined 5/5 client requests (100 %)" in r.out


def flushed_tokens(trace: Path) -> int:
    """Token rows a running server's trace already holds on disk (0 while none is flushed)."""
    try:
        return open_trace(trace).rows("tokens")
    except TracetoolError:
        return 0


def test_server_killed_mid_stream(tmp_path: Path) -> None:
    with server_process(tmp_path / "server", "--threads", "1", "--max-batch", "4") as (url, proc):
        wait_ready(url)
        prober = Prober(ProbeConfig(url=url, n=4, concurrency=4, max_tokens=800, ignore_eos=True, progress=False,
                                    out=tmp_path / "client", timeout_s=60))
        result: list = []
        th = threading.Thread(target=lambda: result.append(__import__("asyncio").run(prober.run())))
        th.start()
        wait_until(lambda: len(prober.live) == 4 and all(r.token_ns for r in list(prober.live.values())),
                   "the four streams to start", timeout=60, interval=0.05)
        # and the server's writer has flushed tokens (every 1 s): a kill before that leaves a
        # readable trace with no token rows yet, which is not what this test is about
        wait_until(lambda: flushed_tokens(tmp_path / "server"), "the server to flush a token row", timeout=60,
                   interval=0.05)
        proc.send_signal(signal.SIGKILL)
        th.join(60)
        stop_process(proc)
    assert not th.is_alive() and result, "the probe did not finish"
    res = result[0]
    assert len(res.results) == 4 and all(not r.ok for r in res.results)
    assert all("connection closed mid-stream" in r.error for r in res.results), [r.error for r in res.results]
    assert all(r.token_ns for r in res.results)  # tokens had arrived before the kill
    rows = open_trace(tmp_path / "client").table("requests").to_pylist()
    assert len(rows) == 4 and {r["status"] for r in rows} == {"error"}
    # the killed server's trace is still readable, marked as not closed
    t = open_trace(tmp_path / "server")
    assert t.meta["closed"] is False and t.rows("tokens") > 0
