"""py-spy CPU sampler: what the server's Python threads are doing, by category, over time.

How it samples, and why:

* ``py-spy record --nonblocking``: the default blocking mode stops every
  thread of the target at each sample, which slows a torch server 5-15x
  (py-spy issue #872). Non-blocking reads may occasionally see a torn stack;
  that costs a mis-classified sample, never the host's speed.
* ``--format chrometrace``: the only py-spy 0.4 output with time in it
  (``raw``/``flamegraph`` are folded counts, ``speedscope`` has no absolute
  time, and polling ``py-spy dump`` costs ~40 ms wall per sample). It lists,
  per thread, the moments the stack changed (begin/end events, microseconds
  since py-spy started), merging consecutive identical samples. tracetool
  rebuilds the stack held between change points, cuts long stretches into
  bins of :data:`BIN_NS`, and estimates each row's sample count from its
  duration at the run's measured rate (py-spy's reported sample count over the
  observed time), so the weights add up to py-spy's count within rounding.
  Resolution: change points are exact sample instants; within an unchanged
  stretch, rows are every 100 ms. Timestamps are anchored to the wall clock
  read just before py-spy is launched (its clock starts a little later, so
  rows may be early by the launch latency; ``benchmarks/bench_samplers.py``
  measures the offset, sample interval included: see benchmarks/RESULTS.md).
* ``--idle``: idle threads are sampled too (without it, a thread that goes
  idle looks frozen in its last busy stack in chrometrace output). Idle is
  then recognised from the frames (``pyspy_rules.toml``).
* Segments: py-spy runs for :data:`SEGMENT_S` at a time and is restarted, so
  its memory and output stay bounded and ``stacks`` rows land during the run
  (a ~0.1 s gap per segment while py-spy re-attaches).

Categories come from ``collectors/pyspy_rules.toml`` (documented there),
extended by the user's own TOML files.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectors.pyspy_rules import Rules, load_rules
from tracetool.errors import BadInput
from tracetool.notices import say_once

DEFAULT_HZ = 100.0
MAX_HZ = 500.0
SEGMENT_S = 30.0
BIN_NS = 100_000_000
ATTACH_TIMEOUT_S = 10.0
#: How long a process may take to look like Python (``record`` attaches right after spawning it).
NOT_PYTHON_GRACE_S = 2.0


class PySpyError(BadInput):
    """py-spy cannot sample the target: not installed, no permission, no such process."""


# -- chrometrace -> stacks rows ------------------------------------------------------------

_THREAD_FRAME = re.compile(r"^thread \((?P<tid>\d+)\)(?::\s*(?P<name>.*))?$")
_LIB_PATH = re.compile(r"^.*?/(?:site|dist)-packages/|^.*?/lib/python\d+(?:\.\d+)?t?/")


def short_path(path: str) -> str:
    """A frame's file as people read it: package-relative for libraries, as is otherwise."""
    return _LIB_PATH.sub("", path.replace("\\", "/"), count=1)


@dataclass
class Stretch:
    """One thread holding one stack from ``start_us`` to ``end_us`` (py-spy's clock)."""

    thread: str
    start_us: int
    end_us: int
    frames: tuple[tuple[str, str], ...]  # root first: (function, file path)


def stretches(events: list[dict[str, Any]], pid: int | None = None) -> list[Stretch]:
    """Rebuild each thread's stack between change points from chrometrace begin/end events.

    Threads are labelled ``name (os thread id)``; py-spy only knows names when
    the target imported ``threading``, so an unnamed thread whose id is the
    process id is called ``MainThread``.
    """
    per_tid: dict[Any, list[dict[str, Any]]] = {}
    names: dict[Any, str] = {}
    for e in events:
        ph = e.get("ph")
        if ph == "M" and e.get("name") == "thread_name":  # newer py-spy: "tid: name" metadata
            label = str((e.get("args") or {}).get("name") or "")
            tid_s, _, nm = label.partition(": ")
            names[e.get("tid")] = _label(tid_s, nm, pid)
        elif ph in ("B", "E"):
            per_tid.setdefault(e.get("tid"), []).append(e)
    out: list[Stretch] = []
    for tid, evs in per_tid.items():
        stack: list[tuple[str, str]] = []
        thread = names.get(tid, f"thread {tid}")
        i, n = 0, len(evs)
        while i < n:
            ts = int(evs[i]["ts"])
            while i < n and int(evs[i]["ts"]) == ts:
                e = evs[i]
                name = str(e.get("name", ""))
                m = _THREAD_FRAME.match(name)
                if m:  # py-spy 0.4.3 --threads: a pseudo root frame "thread (os tid): name"
                    if e["ph"] == "B":
                        thread = _label(m["tid"], m["name"], pid)
                elif e["ph"] == "B":
                    stack.append((name, str((e.get("args") or {}).get("filename", ""))))
                elif stack:
                    stack.pop()
                i += 1
            if stack and i < n:
                out.append(Stretch(thread, ts, int(evs[i]["ts"]), tuple(stack)))
    return out


def _label(tid: str, name: str | None, pid: int | None) -> str:
    if not name and pid is not None and tid == str(pid):
        name = "MainThread"
    return f"{name} ({tid})" if name else f"thread {tid}"


def stack_rows(parts: list[Stretch], *, anchor_ns: int, rate_hz: float, samples: int | None,
               rules: Rules, bin_ns: int = BIN_NS) -> dict[str, list[Any]]:
    """``stacks`` columns from rebuilt stretches.

    Each stretch is cut into bins of ``bin_ns``; a bin's weight is its share of
    samples at the run's effective rate (``samples`` over the observed time,
    else ``rate_hz``), at least 1 for the bin that starts a stretch (py-spy saw
    that stack at that instant). Rounding carries over within a thread.
    """
    cols: dict[str, list[Any]] = {"ts_ns": [], "thread": [], "category": [], "stack": [], "weight": []}
    total_us = sum(p.end_us - p.start_us for p in parts)
    rate = rate_hz
    if samples and total_us > 0:
        rate = samples / (total_us / 1e6)
    carry: dict[str, float] = {}
    folded: dict[tuple[tuple[str, str], ...], tuple[str, str]] = {}
    for p in parts:
        hit = folded.get(p.frames)
        if hit is None:
            text = ";".join(f"{fn} ({short_path(path)})" for fn, path in p.frames)
            hit = folded[p.frames] = (text, rules.classify(p.frames[::-1]))
        text, category = hit
        start_ns, end_ns = p.start_us * 1000, p.end_us * 1000
        first = True
        t = start_ns
        while t < end_ns or first:
            stop = min(end_ns, t + bin_ns)
            want = (stop - t) / 1e9 * rate + carry.get(p.thread, 0.0)
            weight = max(1, round(want)) if first else round(want)
            carry[p.thread] = want - weight
            if weight > 0:
                cols["ts_ns"].append(anchor_ns + t)
                cols["thread"].append(p.thread)
                cols["category"].append(category)
                cols["stack"].append(text)
                cols["weight"].append(weight)
            first = False
            t = stop
    return cols


# -- running py-spy ------------------------------------------------------------------------

_PERMISSION = ("permission denied", "operation not permitted", "elevated permissions")
_GONE = ("failed to get process executable name", "no such process", "process is not running",
         "no such file or directory (os error 2)")
_NOT_PYTHON = ("failed to find python version", "failed to find a python interpreter",
               "couldn't find python")


def pyspy_binary() -> str | None:
    """py-spy next to this interpreter (a venv) or on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("py-spy")


def explain_failure(pid: int, output: str) -> str:
    """The one line a user sees when py-spy cannot sample ``pid``, from py-spy's own output."""
    low = output.lower()
    if any(s in low for s in _PERMISSION):
        return (f"py-spy cannot read process {pid}: permission denied (ptrace). Run as root or give "
                "the CAP_SYS_PTRACE capability (containers: docker run --cap-add SYS_PTRACE); "
                "check /proc/sys/kernel/yama/ptrace_scope")
    if any(s in low for s in _GONE) or not pid_alive(pid):
        return f"py-spy: process {pid} is gone (no such process)"
    if any(s in low for s in _NOT_PYTHON):
        return f"py-spy: process {pid} is not a Python process (or its interpreter is not loaded yet)"
    last = [ln.strip() for ln in output.splitlines() if ln.strip() and not ln.startswith(" ")]
    return f"py-spy failed on process {pid}: {last[0] if last else 'no output'}"


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for py-spy's purposes
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return True


class _Segment:
    """One py-spy process and the reader thread that watches its output."""

    def __init__(self, cmd: list[str], out: Path, wake: threading.Event) -> None:
        self.out = out
        self.lines: list[str] = []
        self.started = threading.Event()
        self.ended = threading.Event()
        self.cpu_ns = 0
        self._wake = wake
        self.anchor_ns = time.time_ns()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, errors="replace",
                                     start_new_session=True)  # a terminal ^C must not end it before we read
        threading.Thread(target=self._read, name="tracetool-pyspy-out", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if "Sampling process" in line:
                self.started.set()
                self._wake.set()
        try:  # reap it ourselves to learn the CPU it used
            _, status, usage = os.wait4(self.proc.pid, 0)
            self.proc.returncode = os.waitstatus_to_exitcode(status)
            self.cpu_ns = int((usage.ru_utime + usage.ru_stime) * 1e9)
        except ChildProcessError:  # already reaped by Popen
            self.proc.wait()
        self.ended.set()
        self._wake.set()

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def samples(self) -> int | None:
        m = re.search(r"Samples:\s*(\d+)", self.text)
        return int(m.group(1)) if m else None

    def stop(self) -> None:
        if not self.ended.is_set():
            try:
                os.kill(self.proc.pid, signal.SIGINT)  # py-spy writes its output on ^C
            except OSError:
                pass
            if not self.ended.wait(15):
                self.proc.kill()
                self.ended.wait(5)


class PySpySampler:
    """Samples a Python process with py-spy into the ``stacks`` table.

    Args:
        recorder: a :class:`collectors.Recorder` (``sink``, ``note``, ``error``).
        pid: the process to sample (default: this one).
        hz: samples per second (1-500; default 100, py-spy's own default).
        rules: extra rules files (TOML, see ``pyspy_rules.toml``), tried before the defaults.
        segment_s: restart py-spy this often (bounds its memory; rows land during the run).
        pyspy_cmd: the command that runs py-spy (default: the installed binary).
        bin_ns: longest time one ``stacks`` row stands for.
        attach_grace_s: how long to retry while the process does not look like Python yet.
    """

    def __init__(self, recorder: Any, pid: int | None = None, hz: float = DEFAULT_HZ, *,
                 rules: Sequence[str | os.PathLike[str]] = (), segment_s: float = SEGMENT_S,
                 pyspy_cmd: Sequence[str] | None = None, bin_ns: int = BIN_NS,
                 attach_grace_s: float = NOT_PYTHON_GRACE_S) -> None:
        self.recorder = recorder
        self.pid = os.getpid() if pid is None else int(pid)
        self.hz = hz
        self.rules = load_rules(rules)
        self.segment_s = segment_s
        self.bin_ns = bin_ns
        self.attach_grace_s = attach_grace_s
        self._cmd = list(pyspy_cmd) if pyspy_cmd else None
        self._tmp: Path | None = None
        self._seg: _Segment | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.segments = 0
        self.rows = 0
        self.samples = 0
        #: CPU time used by the py-spy processes, and by this sampler's thread parsing them (ns).
        self.pyspy_cpu_ns = 0
        self.parse_cpu_ns = 0
        self.ended_reason: str | None = None
        self.finished = threading.Event()

    def _command(self, out: Path) -> list[str]:
        base = self._cmd
        if base is None:
            binary = pyspy_binary()
            if binary is None:
                raise PySpyError("py-spy not found: install it (pip install py-spy) to sample CPU stacks")
            base = [binary]
        rate = max(1, round(self.hz))
        return [*base, "record", "--nonblocking", "--format", "chrometrace", "--threads", "--idle",
                "--nolineno", "--full-filenames", "--rate", str(rate),
                "--duration", str(math.ceil(self.segment_s) + 10),  # a backstop if we die without stopping it
                "--output", str(out), "--pid", str(self.pid)]

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> PySpySampler:
        """Attach py-spy (waiting until it samples) and start the segment thread.

        Raises :class:`PySpyError` with one clear line when py-spy is missing,
        lacks permission, or the process is gone or not Python. This happens at
        set-up, before any host work is sampled.
        """
        if not pid_alive(self.pid):
            raise PySpyError(f"py-spy: process {self.pid} is gone (no such process)")
        self._tmp = Path(tempfile.mkdtemp(prefix="tracetool-pyspy-"))
        grace = time.monotonic() + self.attach_grace_s
        try:
            while True:
                seg = self._attach(ATTACH_TIMEOUT_S)
                if seg.started.is_set():
                    break
                why = explain_failure(self.pid, seg.text)
                # a child that was just spawned may not have loaded its interpreter yet
                if "not a Python process" not in why or time.monotonic() > grace:
                    raise PySpyError(why)
        except BaseException:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise
        self._seg = seg
        self._thread = threading.Thread(target=self._run, name="tracetool-pyspy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop py-spy, write what it sampled, clean up. Idempotent; never raises."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
        self._thread = None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until sampling has ended (stopped, or the target exited); True when it has."""
        return self.finished.wait(timeout)

    @property
    def sampling(self) -> bool:
        """Whether py-spy has attached and is taking samples now (it says "Sampling process")."""
        seg = self._seg
        return seg is not None and seg.started.is_set() and not seg.ended.is_set()

    def __enter__(self) -> PySpySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _attach(self, timeout: float) -> _Segment:
        """Launch a segment and wait until py-spy samples, exits, or ``timeout`` passes."""
        assert self._tmp is not None
        out = self._tmp / f"segment-{self.segments:05d}.json"
        self.segments += 1
        self._wake.clear()
        try:
            seg = _Segment(self._command(out), out, self._wake)
        except OSError as e:
            raise PySpyError(f"cannot run py-spy ({e.strerror or e}: {e.filename or ''})") from e
        deadline = time.monotonic() + timeout
        while not (seg.started.is_set() or seg.ended.is_set() or self._stop.is_set()):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._wake.wait(left)
            self._wake.clear()
        if not seg.started.is_set():
            seg.stop()
        return seg

    # -- the segment loop ------------------------------------------------------------
    def _run(self) -> None:
        seg = self._seg
        try:
            while seg is not None:
                deadline = time.monotonic() + self.segment_s
                while not (seg.ended.is_set() or self._stop.is_set()):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._wake.wait(left)
                    self._wake.clear()
                by_itself = seg.ended.is_set()
                seg.stop()
                self._collect(seg)
                if self._stop.is_set():
                    break
                if by_itself:
                    self._ended(seg)
                    break
                seg = self._seg = self._relaunch()
        except Exception as e:  # never into the host
            self.recorder.error("py-spy sampler", e)
        finally:
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
            self.finished.set()

    def _relaunch(self) -> _Segment | None:
        if not pid_alive(self.pid):
            self._note_end(f"py-spy: process {self.pid} exited; CPU sampling ended")
            return None
        seg = self._attach(ATTACH_TIMEOUT_S)
        if not seg.started.is_set():
            self._collect(seg)
            if not self._stop.is_set():  # stopped while re-attaching: nothing went wrong
                self._ended(seg)
            return None
        return seg

    def _ended(self, seg: _Segment) -> None:
        rc = seg.proc.returncode
        if "process exited" in seg.text.lower() or not pid_alive(self.pid):
            self._note_end(f"py-spy: process {self.pid} exited; CPU sampling ended")
        elif rc is not None and rc < 0:  # py-spy itself was killed (OOM killer, kill -9): not its output's fault
            self._note_end(f"py-spy was killed by signal {_signal_name(-rc)} while sampling process {self.pid}; "
                           "CPU sampling ended (earlier samples are kept)")
        else:
            self._note_end(explain_failure(self.pid, seg.text) + "; CPU sampling ended")

    def _note_end(self, msg: str) -> None:
        self.ended_reason = msg
        say_once(f"pyspy-end-{id(self)}", msg)
        self.recorder.note(msg)

    def _collect(self, seg: _Segment) -> None:
        """Parse one segment's output into ``stacks`` rows (on this thread, off the host's)."""
        cpu0 = time.thread_time_ns()
        self.pyspy_cpu_ns += seg.cpu_ns
        try:
            if not seg.out.exists():
                return
            try:
                events = json.loads(seg.out.read_text(encoding="utf-8", errors="replace"))
            except (OSError, ValueError) as e:
                self.recorder.note(f"py-spy: segment {seg.out.name} unreadable ({e}); its samples are lost")
                return
            parts = stretches(events if isinstance(events, list) else events.get("traceEvents", []), self.pid)
            cols = stack_rows(parts, anchor_ns=seg.anchor_ns, rate_hz=self.hz, samples=seg.samples(),
                              rules=self.rules, bin_ns=self.bin_ns)
            if cols["ts_ns"]:
                self.recorder.sink("stacks").append_batch(cols)
                self.rows += len(cols["ts_ns"])
                self.samples += sum(cols["weight"])
        finally:
            try:
                seg.out.unlink(missing_ok=True)
            except OSError:
                pass
            self.parse_cpu_ns += time.thread_time_ns() - cpu0
