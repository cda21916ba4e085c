"""What scraping a server's /metrics costs the probe (``tracetool probe --metrics-url``).

An engine double (tests/serving/engine_metrics_server.py: one slot, a real prometheus_client
registry under vLLM's names, padded with the other histograms vLLM exports so the page is the
size of a real one) runs in a child process, so its CPU is not the probe's. In this process the
probe sends its requests at concurrency 4, scraping every second, and the benchmark reads:

* the scraper thread's CPU time (``time.thread_time`` inside it: fetch, parse, rows), first
  scrape included, per second of the run: the share of a core scraping takes from the probe
  (the target: < 1 % at 1 Hz);
* per scrape, the scraper's CPU in milliseconds (the first scrape apart, and the one-time
  import of prometheus_client, measured in a fresh process: a warm-up run in this one has
  imported it already), and the page's samples and bytes;
* the same milliseconds against the probe process's own CPU time in the run: a client that
  mostly waits on a slow serial engine spends little CPU, so this share is large;
* side by side, runs without scraping, alternated with runs with it: the process CPU time
  scraping adds in all (the thread, the trace writer flushing its rows, the GIL), per second
  of the run: noisier than the thread's own clock on a shared machine, and the fuller count.

Usage: python benchmarks/bench_metrics_scrape.py [--runs 2] [--requests 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.results import Figure, write  # noqa: E402
from tracetool.serving.probe import ProbeConfig, Prober  # noqa: E402

CHILD = r'''
import sys, time
sys.path.insert(0, sys.argv[1])
from prometheus_client import Histogram
from tests.serving.engine_metrics_server import EngineDouble, MODEL
e = EngineDouble("vllm", tokens=32, prefill_s=0.03, token_s=0.02)
# the other histograms of a vLLM page (docs.vllm.ai "Production Metrics"), with vLLM-like buckets
pad = {"vllm:e2e_request_latency_seconds": 20, "vllm:request_inference_time_seconds": 20,
       "vllm:iteration_tokens_total": 18, "vllm:request_prompt_tokens": 15, "vllm:request_generation_tokens": 15,
       "vllm:request_params_max_tokens": 15, "vllm:request_params_n": 6, "vllm:time_per_output_token_seconds": 20,
       "vllm:request_max_num_generation_tokens": 15}
for name, n in pad.items():
    h = Histogram(name, name, ["model_name"], buckets=[2.0 ** i for i in range(n)], registry=e.registry)
    h.labels(MODEL).observe(3.0)
with e:
    print(e.url, flush=True)
    sys.stdin.read()
'''


def one_run(url: str, n: int, scrape: bool, out: Path) -> dict[str, float]:
    cfg = ProbeConfig(url=url, n=n, concurrency=4, max_tokens=32, out=out, progress=False,
                      metrics_url="auto" if scrape else None, metrics_interval_s=1.0)
    prober = Prober(cfg)
    cpu0, t0 = time.process_time(), time.monotonic()
    asyncio.run(prober.run())
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    res = {"cpu_s": cpu, "wall_s": wall, "scraper_cpu_s": 0.0, "first_cpu_s": 0.0, "scrapes": 0, "rows": 0}
    if prober.scraper is not None:
        st = prober.scraper.stats
        res.update(scraper_cpu_s=st.cpu_s, first_cpu_s=st.first_cpu_s, scrapes=st.scrapes, rows=st.rows)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="runs with and without scraping, alternated")
    ap.add_argument("--requests", type=int, default=40, help="requests per run (about 0.7 s each, one at a time)")
    args = ap.parse_args()
    imported = float(subprocess.run(
        [sys.executable, "-c", "import time; t = time.process_time(); import prometheus_client.parser; "
                               "print(time.process_time() - t)"], capture_output=True, text=True, check=True).stdout)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(REPO)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        import httpx

        page = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=10).text
        samples = sum(1 for ln in page.splitlines() if ln and not ln.startswith("#"))
        with_s, without = [], []
        with TemporaryDirectory() as tmp:
            for scrape in (True, False):  # warm-up: the first run of a process pays its imports
                one_run(url, 4, scrape, Path(tmp) / f"warm-{int(scrape)}")
            for i in range(args.runs):
                for scrape in (True, False):
                    r = one_run(url, args.requests, scrape, Path(tmp) / f"r{i}-{int(scrape)}")
                    (with_s if scrape else without).append(r)
                    print(f"run {i} scrape={scrape}: cpu {r['cpu_s']:.3f} s wall {r['wall_s']:.1f} s "
                          f"scraper {r['scraper_cpu_s'] * 1000:.1f} ms over {r['scrapes']} scrapes", file=sys.stderr)
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(30)
    core = [r["scraper_cpu_s"] / r["wall_s"] * 100 for r in with_s]
    steady = [(r["scraper_cpu_s"] - r["first_cpu_s"]) / (r["scrapes"] - 1) * 1000 for r in with_s if r["scrapes"] > 1]
    first = [r["first_cpu_s"] * 1000 for r in with_s]
    shares = [r["scraper_cpu_s"] / r["cpu_s"] * 100 for r in with_s]
    probe_core = [r["cpu_s"] / r["wall_s"] * 100 for r in without]
    # everything scraping adds to the probe process (the thread, the writer flushing its rows, the
    # GIL): CPU seconds more than the paired run without, per second of the run
    added = [(a["cpu_s"] - b["cpu_s"]) / a["wall_s"] * 100 for a, b in zip(with_s, without, strict=True)]

    def mm(xs: list[float]) -> tuple[float, float]:
        return (min(xs), max(xs))

    runs = f"min-max of {len(with_s)} runs"
    figures = [
        Figure("scraper CPU at 1 Hz, % of one core (first scrape included)", statistics.median(core), "%",
               interval=mm(core), interval_is=runs, target="< 1 %", met=max(core) < 1.0),
        Figure("scraper CPU per scrape after the first (fetch, parse, rows)", statistics.median(steady), "ms",
               interval=mm(steady), interval_is=runs),
        Figure("scraper CPU of the first scrape (connection, every family parsed)", statistics.median(first),
               "ms", interval=mm(first), interval_is=runs),
        Figure("one-time: importing prometheus_client's parser in a fresh process", imported * 1000, "ms"),
        Figure("scraper CPU, share of this light probe's CPU", statistics.median(shares), "%",
               interval=mm(shares), interval_is=runs),
        Figure("probe CPU without scraping, % of one core", statistics.median(probe_core), "%",
               interval=mm(probe_core), interval_is=runs),
        Figure("probe process CPU added by scraping at 1 Hz (thread, writer, GIL), % of one core",
               statistics.median(added), "%", interval=mm(added), interval_is=f"min-max of {len(added)} pairs",
               target="< 1 %", met=max(added) < 1.0),
        Figure("metrics page: samples", samples, "samples"),
        Figure("metrics page: size", len(page.encode()) / 1024, "KiB"),
        Figure("probe run: wall time", statistics.median(r["wall_s"] for r in with_s), "s"),
    ]
    write("bench_metrics_scrape", figures,
          note=f"{args.requests} requests at concurrency 4 against a one-slot engine double (32 tokens each), "
               "scraped every second; the engine runs in a child process. The target is on the scraper's CPU "
               "as a share of a core (what it takes from the probe's CPU); against this light probe's own CPU "
               "time (a client waiting on a slow serial engine) the same milliseconds are a larger share, "
               "reported as such")


if __name__ == "__main__":
    main()
