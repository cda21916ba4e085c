"""Load and soak: `tracetool serve` under `tracetool probe` at concurrency 32, recording everything.

Four servers of the demo model run side by side, each in its own process
with one torch thread:

* **ON**: the recorder, the NVML sampler at 10 Hz fed by the **scripted NVML
  double** of ``tests/system/nvml_double.py`` (this machine has no GPU: its
  rows are *not* real readings; the GPU is named ``SCRIPTED NVML DOUBLE``, no
  hardware preset matches it, and ``meta.json`` carries a note saying so), and
  the live endpoint with a ``tracetool attach --record`` viewer attached the
  whole time;
* **REC**: the recorder alone (no NVML, no live endpoint);
* **OFF**: ``--no-record``: the same collectors installed but switched off;
* **TWIN**: a second OFF, the A/A arm: TWIN/OFF is what two identical servers
  differ by on this machine (process placement, memory layout, the load's
  luck), the noise floor the ON/OFF and REC/OFF ratios are read against;
* **SWITCH**: set up as ON (recorder, NVML double, live endpoint, a viewer of
  its own), its recording switched on and off at run time between windows
  (``Recorder.enabled``, flipped by SIGUSR1/SIGUSR2 in this benchmark's server
  process only): the same process on and off, so no process's luck is in the
  ratio. While it is off the NVML sampler pauses too (no NVML calls, no rows).

Phase 1, the soak: the probe keeps ``--concurrency`` requests in flight on ON
for ``--minutes``; the server's RSS (and its live endpoint process's) is
sampled every 2 s and fitted by least squares after a warm-up (the first
fifth), giving the slope in MiB/min.

Phase 2, the cost: ``--rounds`` rounds of one window of ``--window-requests``
requests on each server, same load, in rotating order (a balanced Latin
square: each server takes each place once in four rounds and follows each other
server once, so drift and carry-over cancel); the ratios ON/OFF, REC/OFF and
TWIN/OFF of output tokens per second per round, and of server CPU per token,
with median and spread. Phase 3, within one process: ``--rounds`` rounds of
two windows on SWITCH, recording on and off (on first in odd rounds, off first
in even ones), the ratio on/off per round.

At the end the servers get SIGTERM (traces closed), and the books are
balanced: tokens the probe received from each server equal the tokens it says
it generated, which equal the token rows in its trace plus the rows dropped
(``meta.json``); the viewer's saved rows and the rows the stream dropped for
it are reported.

    python benchmarks/soak.py                          # 10 minutes, then 8 rounds of 128 requests
    python benchmarks/soak.py --minutes 0.25 --rounds 1 --window-requests 32   # the smoke run (~1.5 min)
    python benchmarks/soak.py --pin --rounds 12 --window-requests 64            # server side on CPU 0
    python benchmarks/soak.py --pin --live-flush-s 0.1                          # ON and SWITCH flushing every 0.1 s

``--pin`` splits the machine the way a deployment is split: the four servers
(and with them ON's live endpoint process, which inherits the affinity) run on
CPU 0, the load generator (this process) and the viewer on CPU 1, standing in
for the clients and the engineer's laptop on other machines. Everything the
recorder, the NVML sampler and the live endpoint cost the server is still on
the server's core and counted; what is left out is the viewer's and the
probe's own CPU, which on an unpinned 2-core box lands on the server too (the
unpinned run measures that colocated case).

Prints a summary and a Markdown block for ``benchmarks/RESULTS.md``.
Exit 0 when the books balance and no row was lost uncounted; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DOUBLE_NAME = "SCRIPTED NVML DOUBLE (benchmarks/soak.py; not a GPU)"
DOUBLE_NOTE = ("gpu: the rows of this trace come from a scripted NVML double (benchmarks/soak.py, "
               "tests/system/nvml_double.py), not from a GPU: they are not real readings")


# -- the server processes ------------------------------------------------------------------------------
def start_nvml_double(rec: Any, hz: float, pid: int) -> Any:
    """The ``--nvml`` sampler of the ON server, fed by the scripted double (a SamplerSpec target)."""
    sys.path.insert(0, str(REPO / "tests" / "system"))
    from nvml_double import GpuScript, ScriptedNvml

    from collectors.nvml import NvmlSampler

    rec.note(DOUBLE_NOTE)
    return NvmlSampler(rec, hz, api=ScriptedNvml([GpuScript(name=DOUBLE_NAME)])).start()


def serve_main(argv: list[str]) -> int:
    """``soak.py _serve OUT on|rec|off|twin|switch [FLUSH_S]``: one server, run in this process
    until SIGTERM; FLUSH_S is the live flush interval of ON and SWITCH (default ``LIVE_FLUSH_S``)."""
    out, mode = Path(argv[0]), argv[1]
    from collectors.launcher import SAMPLERS, SamplerSpec
    from tracetool.live.config import LiveConfig
    from tracetool.serving.runner import ServeConfig, run_server

    samplers: dict[str, float] = {}
    live = None
    if mode in ("on", "switch"):  # everything: recorder, NVML (double), live endpoint
        SAMPLERS["nvml"] = SamplerSpec("__main__:start_nvml_double", 10.0, "scripted NVML double (soak only)")
        samplers = {"nvml": 10.0}
        live = (LiveConfig("127.0.0.1:0") if len(argv) < 3
                else LiveConfig("127.0.0.1:0", flush_interval_s=float(argv[2])))
    if mode == "switch":
        _switch_by_signals(Path(f"{out}.threads.json"))
    cfg = ServeConfig(out=out, port=0, threads=1, force=True, samplers=samplers, live=live,
                      record=mode not in ("off", "twin"))
    return run_server(cfg)


def _switch_by_signals(names: Path) -> None:
    """SIGUSR1 switches the server's recording on, SIGUSR2 off (``Recorder.enabled``), each
    acknowledged on stderr after writing ``names``: native thread id -> thread name, for
    per-thread CPU from ``/proc`` (benchmarks/bench_live_flush.py). The benchmark's own server
    process only: the Recorder class is wrapped here to find the instance ``run_server`` makes."""
    import tracetool.recorder as cr

    made: list[Any] = []
    base = cr.Recorder

    class Switched(base):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            made.append(self)

    cr.Recorder = Switched  # type: ignore[misc]

    def switch(signum: int, frame: Any) -> None:
        on = signum == signal.SIGUSR1
        names.write_text(json.dumps({t.native_id: t.name for t in threading.enumerate()}))
        for r in made:
            r.enabled = on
        print(f"{SWITCH_ACK}{'on' if on else 'off'}", file=sys.stderr, flush=True)

    signal.signal(signal.SIGUSR1, switch)
    signal.signal(signal.SIGUSR2, switch)


SWITCH_ACK = "soak: recording "


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[str]
    url: str = ""
    live: str = ""
    generated: int | None = None
    lines: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    #: set when the server acknowledges a recording switch (SWITCH only)
    switched: threading.Event = field(default_factory=threading.Event)

    def record(self, on: bool) -> None:
        """Switch SWITCH's recording and wait for the server to say it did."""
        self.switched.clear()
        self.proc.send_signal(signal.SIGUSR1 if on else signal.SIGUSR2)
        if not self.switched.wait(30):
            raise SystemExit(f"{self.name} did not acknowledge the recording switch")

    def read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())
            if line.startswith("tracetool: serving "):
                self.url = line.split()[2]
                self.ready.set()
            elif line.startswith("tracetool: live: streaming this trace on "):
                self.live = line.split()[6]
            elif "tokens generated)" in line:
                self.generated = int(line.rsplit("(", 1)[1].split()[0])
            elif line.startswith(SWITCH_ACK):
                self.switched.set()
        self.ready.set()

    def wait_generated(self, timeout_s: float = 10.0) -> None:
        """After SIGTERM: wait for the stderr reader to take the last line ("N tokens generated")."""
        deadline = time.monotonic() + timeout_s
        while self.generated is None and time.monotonic() < deadline:
            time.sleep(0.05)

    def pids(self) -> list[int]:
        """The server and its children (the live endpoint process)."""
        kids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                    kids.append(int(stat.parent.name))
            except (OSError, ValueError, IndexError):
                continue
        return [self.proc.pid, *kids]


def pinned(cpus: set[int] | None) -> Any:
    """A ``preexec_fn`` that puts the child on ``cpus`` (None: no pinning)."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def launch(name: str, out: Path, cpus: set[int] | None = None, flush_s: float | None = None) -> Server:
    """Start a ``name`` server (on, rec, off, twin, switch) writing its trace to ``out``."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    flush = [] if flush_s is None else [str(flush_s)]
    proc = subprocess.Popen([sys.executable, __file__, "_serve", str(out), name, *flush], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=pinned(cpus))
    s = Server(name, proc)
    threading.Thread(target=s.read, daemon=True).start()
    return s


def start_viewer(live: str, directory: Path) -> subprocess.Popen[str]:
    """``tracetool attach LIVE --record DIRECTORY`` until SIGTERM (pinned as this process is)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tracetool", "attach", live, "--record", str(directory), "--force",
         "--duration", "86400", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)))


def stop(viewers: dict[str, subprocess.Popen[str]], servers: list[Server]) -> dict[str, str]:
    """SIGTERM the viewers (each saves its trace first and exits 130), then the servers (their
    traces closed); what each viewer printed. The last rows reach a viewer within the live flush
    interval (0.2 s) and a poll, so viewers still running get 2 s for them first: one stopped
    right after a recording window would save the trace without them."""
    if any(v.poll() is None for v in viewers.values()):
        time.sleep(2)
    for viewer in viewers.values():
        if viewer.poll() is None:
            # SIGTERM, not SIGINT: a background job of a non-interactive shell starts with SIGINT
            # ignored, and so does this child
            viewer.send_signal(signal.SIGTERM)
    for s in servers:
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGTERM)
    for s in servers:
        try:
            s.proc.wait(120)
        except subprocess.TimeoutExpired:
            s.proc.kill()
    said: dict[str, str] = {}
    for name, viewer in viewers.items():
        try:
            said[name], _ = viewer.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # reported (exit -9), not a traceback that loses the figures
            viewer.kill()
            said[name], _ = viewer.communicate()
    return said


def proc_cpu_s(stat: Path) -> float:
    """User + system CPU seconds of a process or thread so far, from its ``stat`` file."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class RssSampler:
    """RSS of the ON server and of its live endpoint process, every ``every_s``."""

    def __init__(self, server: Server, every_s: float = 2.0) -> None:
        self.server = server
        self.every_s = every_s
        self.samples: list[tuple[float, float, float]] = []  # (t, server MiB, endpoint MiB)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def _run(self) -> None:
        self.t0 = time.monotonic()  # the soak phase starts now (server start-up is not in the fit)
        while not self.stop.wait(self.every_s):
            pids = self.server.pids()
            main = rss_mib(pids[0]) or 0.0
            side = sum(rss_mib(p) or 0.0 for p in pids[1:])
            self.samples.append((time.monotonic() - self.t0, main, side))


def slope_mib_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB), in MiB per minute."""
    if len(points) < 3:
        return float("nan")
    xs = [p[0] / 60 for p in points]
    ys = [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else float("nan")


# -- load ---------------------------------------------------------------------------------------------
@dataclass
class Window:
    server: str
    requests: int
    failed: int
    tokens: int
    seconds: float
    #: CPU seconds the server's processes (server and live endpoint) used during the window.
    cpu_s: float = 0.0
    #: whether the server was recording (False for OFF and TWIN, and SWITCH switched off)
    recording: bool = True

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_ms_per_token(self) -> float:
        return 1000 * self.cpu_s / self.tokens if self.tokens else float("nan")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (``/proc/PID/stat`` utime, stime)."""
    total = 0.0
    for pid in pids:
        try:
            total += proc_cpu_s(Path(f"/proc/{pid}/stat"))
        except (OSError, ValueError, IndexError):
            continue
    return total


def probe(url: str, server: str, n: int, args: argparse.Namespace) -> Window:
    from tracetool.serving.probe import ProbeConfig, run_probe

    res = run_probe(ProbeConfig(url=url, n=n, concurrency=args.concurrency, prompt_tokens=args.prompt_tokens,
                                max_tokens=args.max_tokens, ignore_eos=True, progress=False, timeout_s=600,
                                seed=int(time.time())))
    ok = [r for r in res.results if r.ok]
    tokens = sum(r.output_tokens if r.output_tokens is not None else len(r.token_ns) for r in ok)
    return Window(server, len(res.results), len(res.results) - len(ok), tokens, res.wall_s)


def machine_load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


# -- the run ------------------------------------------------------------------------------------------
#: The servers, the A/A twin of OFF last.
NAMES = ("on", "rec", "off", "twin")
#: Window orders of the cost phase, cycled: a balanced Latin square (Williams design) of the four
#: servers: in four rounds each takes each place once and directly follows each other one once.
ORDERS = [("on", "rec", "twin", "off"), ("rec", "off", "on", "twin"),
          ("off", "twin", "rec", "on"), ("twin", "on", "off", "rec")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the soak phase on ON")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=8,
                    help="rounds of the cost phase (one window per server; a multiple of 4 balances the order)")
    ap.add_argument("--window-requests", type=int, default=128, help="requests per cost-phase window")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None, help="keep the traces here (default: a temp dir)")
    ap.add_argument("--live-flush-s", type=float, default=None,
                    help="ON's and SWITCH's live flush interval (default: tracetool's, LIVE_FLUSH_S)")
    ap.add_argument("--pin", action="store_true",
                    help="servers (and ON's live endpoint) on CPU 0; the probe and the viewer on CPU 1")
    ap.add_argument("--no-result", action="store_true", help="do not write benchmarks/results/soak.json")
    args = ap.parse_args()
    server_cpus = client_cpus = None
    if args.pin:
        if (os.cpu_count() or 1) < 2:
            raise SystemExit("--pin needs 2 CPUs")
        server_cpus, client_cpus = {0}, {1}
        os.sched_setaffinity(0, client_cpus)  # the probe runs here; the viewer inherits it
    out = args.out or Path(tempfile.mkdtemp(prefix="tracetool-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    pin = f"; servers on CPU {server_cpus}, probe and viewer on CPU {client_cpus}" if args.pin else ""
    from tracetool.live.config import LIVE_FLUSH_S

    flush = args.live_flush_s if args.live_flush_s is not None else LIVE_FLUSH_S
    print(f"soak: load average before {machine_load()}, {os.cpu_count()} CPUs{pin}; live flush every {flush:g} s; "
          f"traces in {out}", flush=True)

    servers = {name: launch(name, out / name, server_cpus, args.live_flush_s) for name in (*NAMES, "switch")}
    on, sw = servers["on"], servers["switch"]
    viewers: dict[str, subprocess.Popen[str]] = {}
    windows: list[Window] = []
    soak: list[Window] = []
    switched: list[dict[str, Window]] = []
    rss = RssSampler(on)
    try:
        for s in servers.values():
            if not s.ready.wait(300) or not s.url:
                raise SystemExit(f"{s.name} server did not start:\n" + "\n".join(s.lines[-20:]))
        for name, vdir in (("on", "viewer"), ("switch", "viewer-switch")):
            viewers[name] = start_viewer(servers[name].live, out / vdir)
        for name, s in servers.items():  # warm each (first requests pay one-time costs)
            windows.append(probe(s.url, name, args.concurrency, args))
            windows[-1].recording = name not in ("off", "twin")

        rss.thread.start()
        t_end = time.monotonic() + args.minutes * 60
        while time.monotonic() < t_end:
            soak.append(probe(on.url, "on", args.concurrency * 2, args))
            print(f"soak: {time.monotonic() - rss.t0:6.0f} s  {soak[-1].tok_s:7.1f} tok/s  "
                  f"server RSS {rss.samples[-1][1] if rss.samples else 0:.0f} MiB", flush=True)
        rss.stop.set()
        rss.thread.join()
        windows += soak

        for i in range(args.rounds):
            got = {}
            for name in ORDERS[i % len(ORDERS)]:
                c0 = cpu_seconds(servers[name].pids())
                got[name] = probe(servers[name].url, name, args.window_requests, args)
                got[name].cpu_s = cpu_seconds(servers[name].pids()) - c0
            windows += got.values()
            print(f"cost: round {i + 1}: " + ", ".join(f"{n.upper()} {got[n].tok_s:.1f}" for n in NAMES)
                  + " tok/s; " + ", ".join(f"{n.upper()}/OFF {got[n].tok_s / got['off'].tok_s:.3f}"
                                           for n in NAMES if n != "off")
                  + "; server CPU ms/token " + ", ".join(f"{n.upper()} {got[n].cpu_ms_per_token:.2f}" for n in NAMES),
                  flush=True)

        for i in range(args.rounds):  # phase 3: one process, recording switched on and off
            pair: dict[str, Window] = {}
            for state in ("on", "off") if i % 2 == 0 else ("off", "on"):
                sw.record(state == "on")
                c0 = cpu_seconds(sw.pids())
                w = pair[state] = probe(sw.url, "switch", args.window_requests, args)
                w.cpu_s = cpu_seconds(sw.pids()) - c0
                w.recording = state == "on"
            switched.append(pair)
            print(f"switch: round {i + 1}: on {pair['on'].tok_s:.1f}, off {pair['off'].tok_s:.1f} tok/s, "
                  f"on/off {pair['on'].tok_s / pair['off'].tok_s:.3f}; CPU ms/token on "
                  f"{pair['on'].cpu_ms_per_token:.2f}, off {pair['off'].cpu_ms_per_token:.2f}", flush=True)
    finally:
        rss.stop.set()
        view_out = stop(viewers, list(servers.values()))
    for s in servers.values():
        s.wait_generated()
    return report(args, out, servers, soak, windows, switched, rss, view_out,
                  {n: v.returncode for n, v in viewers.items()})


def _ratio_line(name: str, ratios: list[float]) -> str:
    if not ratios:
        return f"{name}: no rounds"
    sd = f" ± {statistics.stdev(ratios):.3f}" if len(ratios) > 1 else ""
    return (f"{name}: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}; "
            f"mean {statistics.fmean(ratios):.3f}{sd}) over {len(ratios)} rounds: "
            + ", ".join(f"{r:.3f}" for r in ratios))


def report(args: argparse.Namespace, out: Path, servers: dict[str, Server], soak: list[Window],
           windows: list[Window], switched: list[dict[str, Window]], rss: RssSampler, view_out: dict[str, str],
           view_rc: dict[str, int | None]) -> int:
    from tracetool.reader import open_trace

    on = servers["on"]
    t = open_trace(out / "on", strict=True)
    trace_tokens = t.rows("tokens")
    dropped = {k: v for k, v in (t.meta.get("dropped_rows") or {}).items() if v}
    notes = t.meta.get("notes") or []
    errors = [n for n in notes if n.startswith("collector errors")]
    live = t.meta.get("live") or {}
    every = windows + [w for pair in switched for w in pair.values()]
    probe_tokens = {n: sum(w.tokens for w in every if w.server == n) for n in servers}
    failed = sum(w.failed for w in every)
    books = {n: servers[n].generated == probe_tokens[n] for n in servers}
    on_books = on.generated is not None and trace_tokens + int(dropped.get("tokens", 0)) == on.generated
    rec_trace = open_trace(out / "rec", strict=True)
    rec_books = _accounted(rec_trace) == servers["rec"].generated
    sw_trace = open_trace(out / "switch", strict=True)
    sw_recorded = sum(w.tokens for w in every if w.server == "switch" and w.recording)
    sw_books = _accounted(sw_trace) == sw_recorded
    v_tokens, v_dropped = _viewer(out / "viewer", view_out.get("on", ""))
    sv_tokens, sv_dropped = _viewer(out / "viewer-switch", view_out.get("switch", ""))
    # a viewer attached before the first request holds every token row the server's trace does,
    # or the stream counted what it dropped for it
    viewer_books = v_tokens + v_dropped == trace_tokens and sv_tokens + sv_dropped == sw_trace.rows("tokens")
    ok = (on_books and rec_books and sw_books and viewer_books and all(books.values()) and not errors
          and failed == 0 and DOUBLE_NOTE in notes and all(rc == 130 for rc in view_rc.values()))

    warm = args.minutes * 60 * 0.2
    slope = slope_mib_per_min([(s[0], s[1]) for s in rss.samples if s[0] >= warm])
    side_slope = slope_mib_per_min([(s[0], s[2]) for s in rss.samples if s[0] >= warm])
    first = next((s[1] for s in rss.samples if s[0] >= warm), float("nan"))
    last = rss.samples[-1][1] if rss.samples else float("nan")
    peak = max((s[1] for s in rss.samples), default=float("nan"))
    side_last = rss.samples[-1][2] if rss.samples else float("nan")
    rates = [w.tok_s for w in soak]
    cost = [w for w in windows[len(servers) + len(soak):]]
    k = len(NAMES)
    by_round = [cost[i:i + k] for i in range(0, len(cost), k)]
    rate = {n: [_rate(r, n) / _rate(r, "off") for r in by_round] for n in NAMES}
    cpu = {n: [_cpu(r, n) for r in by_round] for n in NAMES}
    cpu_ratio = {n: [_cpu(r, n) / _cpu(r, "off") for r in by_round] for n in NAMES}
    sw_rate = [p["on"].tok_s / p["off"].tok_s for p in switched]
    sw_cpu = [p["on"].cpu_ms_per_token / p["off"].cpu_ms_per_token for p in switched]

    lines = [
        f"load average at the end: {machine_load()}",
        f"soak: {args.minutes:g} min at concurrency {args.concurrency} on ON ({len(soak)} rounds, "
        f"{sum(w.requests for w in soak):,} requests, {sum(w.tokens for w in soak):,} tokens); "
        f"throughput {min(rates, default=0):.1f}-{max(rates, default=0):.1f} tok/s "
        f"(median {statistics.median(rates) if rates else 0:.1f})",
        f"failed requests: {failed} of {sum(w.requests for w in windows):,}",
        f"ON trace: {trace_tokens:,} token rows; the server generated {on.generated:,}; the probe received "
        f"{probe_tokens['on']:,}; dropped rows {dropped or 'none'}; collector errors {errors or 'none'}",
        f"REC trace: {rec_trace.rows('tokens'):,} token rows; generated {servers['rec'].generated:,}; "
        f"received {probe_tokens['rec']:,}",
        f"ON live endpoint: viewers served {live.get('viewers_served')}, rows dropped for viewers "
        f"{live.get('rows_dropped_for_viewers')}, before the endpoint {live.get('rows_dropped_before_endpoint')}",
        f"viewer (attach --record): {v_tokens:,} token rows saved, {v_dropped:,} dropped by the stream for it "
        f"(exit {view_rc.get('on')}; 130: stopped with SIGTERM, trace saved)",
        f"SWITCH trace: {sw_trace.rows('tokens'):,} token rows; {sw_recorded:,} tokens generated while recording "
        f"(of {servers['switch'].generated:,}); its viewer saved {sv_tokens:,}, {sv_dropped:,} dropped for it "
        f"(exit {view_rc.get('switch')})",
        f"ON server RSS: {first:.0f} MiB after the warm-up fifth, {last:.0f} MiB at the end, peak {peak:.0f} MiB; "
        f"slope {slope:+.2f} MiB/min; live endpoint process {side_last:.0f} MiB, slope {side_slope:+.2f} MiB/min",
        _ratio_line("cost ON/OFF (recorder + NVML double + live viewer)", rate["on"]),
        _ratio_line("cost REC/OFF (recorder alone)", rate["rec"]),
        _ratio_line("cost TWIN/OFF (A/A: two OFF servers, the noise floor)", rate["twin"]),
        "server CPU per token (server + live endpoint processes; steadier than throughput on a shared "
        "machine): median " + ", ".join(f"{n.upper()} {statistics.median(v):.3f} ms" for n, v in cpu.items() if v),
        _ratio_line("CPU per token ON/OFF", cpu_ratio["on"]),
        _ratio_line("CPU per token REC/OFF", cpu_ratio["rec"]),
        _ratio_line("CPU per token TWIN/OFF (A/A)", cpu_ratio["twin"]),
        _ratio_line("SWITCH on/off, one process (recorder + NVML double + live viewer)", sw_rate),
        _ratio_line("SWITCH CPU per token on/off", sw_cpu),
    ]
    print("\n".join(lines))
    print(f"soak: {'OK' if ok else 'FAILED'} (books balance on every server, no failed request, "
          "no collector error, the NVML double labelled, the viewers saved their traces on SIGTERM "
          "and hold every row or count it dropped)")
    if not args.no_result:
        from benchmarks.results import Figure, write

        lost = (on.generated or 0) - trace_tokens - int(dropped.get("tokens", 0))
        write("soak", [
            Figure(f"{args.minutes:g} min at concurrency {args.concurrency}: books balance on every server and "
                   "viewer, no failed request, no collector error", 1.0 if ok else 0.0, "yes/no", target="yes", met=ok),
            Figure("tokens the ON server generated that its trace lacks (nor counts dropped)", lost, "tokens",
                   target="0", met=lost == 0),
            Figure("failed requests", failed, "requests", target="0", met=failed == 0),
            Figure("ON server RSS slope after the warm-up fifth", slope, "MiB/min"),
        ], note=f"ON = recorder + NVML sampler fed by the scripted NVML double + live viewer; "
                f"{sum(w.requests for w in every):,} requests")
    return 0 if ok else 1


def _accounted(trace: Any) -> int:
    """A trace's token rows plus the token rows its meta.json says were dropped."""
    return int(trace.rows("tokens") + int((trace.meta.get("dropped_rows") or {}).get("tokens", 0)))


def _viewer(directory: Path, out: str) -> tuple[int, int]:
    """Token rows a viewer saved, and the rows the stream dropped for it (from its --json)."""
    from tracetool.reader import open_trace

    try:
        doc = json.loads(out) if out.strip() else {}
    except ValueError:
        doc = {}
    server = (doc.get("servers") or [{}])[0]
    saved = open_trace(directory).rows("tokens") if (directory / "meta.json").exists() else 0
    return saved, int((server.get("dropped_rows") or {}).get("tokens", 0)) if server else 0


def _rate(rnd: list[Window], name: str) -> float:
    return next(w.tok_s for w in rnd if w.server == name)


def _cpu(rnd: list[Window], name: str) -> float:
    return next(w.cpu_ms_per_token for w in rnd if w.server == name)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        sys.exit(serve_main(sys.argv[2:]))
    sys.exit(main())
