"""Serving path figures, measured side by side in one run.

1. What the ASGI middleware costs per request and per streamed event: the same
   Starlette app with and without ``TracetoolMiddleware``, driven in-process
   (httpx.ASGITransport: no sockets, so only the middleware differs), rounds
   interleaved; min and median of rounds (the machine is shared: the min is
   the least disturbed figure).
2. How well network time is attributed: ``tracetool serve`` (demo model)
   probed directly and through the loopback delay proxy at several added RTTs;
   per-request network = client.request − server.request from the probe's trace.

    python benchmarks/bench_serving.py [--rounds 5] [--requests 300] [--rtts 0,50,200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _app(rec: object | None) -> object:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    from collectors.asgi import TracetoolMiddleware, request_handle

    async def plain(request: object) -> JSONResponse:
        h = request_handle(request)
        if h is not None:
            with h.span("tokenize"):
                pass
        return JSONResponse({"ok": True})

    async def sse(request: object) -> StreamingResponse:
        async def gen() -> object:
            for i in range(64):
                yield f'data: {{"choices":[{{"index":0,"delta":{{"content":"t{i}"}}}}]}}\n\n'
            yield 'data: {"choices":[],"usage":{"completion_tokens":64}}\n\ndata: [DONE]\n\n'
        return StreamingResponse(gen(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/plain", plain), Route("/sse", sse)])
    return app if rec is None else TracetoolMiddleware(app, recorder=rec)  # type: ignore[arg-type]


async def _drive(app: object, path: str, n: int) -> float:
    import httpx

    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as c:
        await c.get(path)
        t = time.perf_counter()
        for _ in range(n):
            r = await c.get(path)
            r.read()
        return (time.perf_counter() - t) / n


def bench_middleware(rounds: int, n: int) -> dict[str, tuple[float, float]]:
    """Per response kind: (without, with) seconds per request, the least disturbed round."""
    from collectors import Recorder

    out = {}
    with tempfile.TemporaryDirectory() as d:
        rec = Recorder(Path(d) / "t").start()
        bare, wrapped = _app(None), _app(rec)
        for path, label in (("/plain", "JSON response"), ("/sse", "SSE, 64 events")):
            a, b = [], []
            for _ in range(rounds):  # interleaved, so load from others hits both alike
                a.append(asyncio.run(_drive(bare, path, n)))
                b.append(asyncio.run(_drive(wrapped, path, n)))
            for stat, f in (("min", min), ("median", statistics.median)):
                ma, mb = f(a), f(b)
                print(f"  {label:<16} {stat:<6} without {ma * 1e6:8.1f} us/request   with {mb * 1e6:8.1f} "
                      f"us/request   {(mb - ma) * 1e6:+7.1f} us ({mb / ma:.2f}x)")
            out[label] = (min(a), min(b))
        rec.close()
    return out


def bench_network(rtts: list[float], n: int) -> dict[float, float]:
    """Per added RTT: the mean network time attributed per request, ms."""
    from tracetool.reader import open_trace
    from tracetool.serving.demo import server_process
    from tracetool.serving.probe import ProbeConfig, run_probe
    from tracetool.serving.proxy import DelayProxy

    measured = {}
    with tempfile.TemporaryDirectory() as d, \
            server_process(Path(d) / "server", "--threads", "1", "--max-batch", "4") as (url, _):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        for rtt in rtts:
            out = Path(d) / f"client-{rtt:g}"
            if rtt:
                with DelayProxy(("127.0.0.1", port), rtt_ms=rtt) as proxy:
                    res = run_probe(ProbeConfig(url=f"{proxy.url}/v1", n=n, concurrency=2, prompt_tokens=32,
                                                max_tokens=8, ignore_eos=True, progress=False, out=out))
            else:
                res = run_probe(ProbeConfig(url=url, n=n, concurrency=2, prompt_tokens=32, max_tokens=8,
                                            ignore_eos=True, progress=False, out=out))
            spans = open_trace(out).table("spans").to_pylist()
            c = {s["request_id"]: s["end_ns"] - s["start_ns"] for s in spans if s["name"] == "client.request"}
            s = {s["request_id"]: s["end_ns"] - s["start_ns"] for s in spans if s["name"] == "server.request"}
            net = [(c[k] - s[k]) / 1e6 for k in c if k in s]
            e2e = [v / 1e6 for v in c.values()]
            err = (f"  error vs added RTT {statistics.mean(net) - rtt:+6.1f} ms "
                   f"({(statistics.mean(net) - rtt) / rtt:+.1%})" if rtt else "")
            ok = sum(r.ok for r in res.results)
            print(f"  added RTT {rtt:5.0f} ms: network mean {statistics.mean(net):6.1f} ms, "
                  f"p50 {statistics.median(net):6.1f} ms, share of e2e {sum(net) / sum(e2e):5.1%} "
                  f"({ok}/{n} ok){err}")
            measured[rtt] = statistics.mean(net)
    return measured


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--rtts", default="0,50,200")
    p.add_argument("--probe-requests", type=int, default=12)
    p.add_argument("--no-result", action="store_true", help="do not write benchmarks/results/bench_serving.json")
    a = p.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print(f"ASGI middleware, in-process, {a.rounds} interleaved rounds of {a.requests} requests:")
    mw = bench_middleware(a.rounds, a.requests)
    print(f"network attribution, tracetool serve (demo model) + probe, {a.probe_requests} requests, concurrency 2:")
    net = bench_network([float(x) for x in a.rtts.split(",")], a.probe_requests)
    if a.no_result:
        return
    from benchmarks.results import Figure, write

    figures = [Figure(f"ASGI middleware, added per request ({label}; least disturbed round)",
                      (w - b) * 1e6, "µs") for label, (b, w) in mw.items()]
    base = net.get(0.0)
    for rtt, ms in net.items():
        if rtt and base is not None:
            figures.append(Figure(f"network attributed for an added {rtt:g} ms RTT, over the loopback's own",
                                  ms - base, "ms"))
    write("bench_serving", figures)


if __name__ == "__main__":
    main()
