"""Zero-code recording: launch an unmodified Python program with the collectors installed.

``tracetool record -o DIR -- python script.py ARGS`` works the way
``opentelemetry-instrument`` does: the child gets ``collectors/_bootstrap`` at
the front of ``PYTHONPATH``, whose ``sitecustomize`` (chaining to any other
``sitecustomize``) starts a :class:`~tracetool.recorder.Recorder` on ``DIR``
and patches ``transformers`` when it is imported (:func:`collectors.hf.autopatch`).
The trace is closed at interpreter exit, also after an exception, Ctrl-C
(``KeyboardInterrupt``) or SIGTERM, and the parent exits with the child's code
(128 + signal when it was killed: 130 for SIGINT).

The parent (:func:`run_recording`) also makes sure a trace exists when the
child could not load the collectors (not Python, or a Python without
tracetool), and runs the samplers of :data:`SAMPLERS` (NVML, py-spy; wired in
by their own modules) into a side trace merged into ``DIR`` at the end.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracetool.errors import BadInput, UsageError
from tracetool.meta import write_meta
from tracetool.schema import META_FILE
from tracetool.untrusted import echo
from tracetool.writer.output import prepare_output

ENV_DIR = "TRACETOOL_RECORD_DIR"
ENV_OPTIONS = "TRACETOOL_RECORD_OPTIONS"
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "_bootstrap"
NO_TORCH_NOTE = "the program never imported torch: nothing to record (this trace is empty)"
NOT_LOADED_NOTE = ("the command did not load tracetool's collectors (not a Python program, or a Python "
                   "without tracetool installed): nothing was recorded")


@dataclass(frozen=True)
class SamplerSpec:
    """A sampler ``tracetool record`` can run beside the program (``--<name>[=HZ]``).

    ``target`` is ``"module:function"`` with the signature
    ``start(recorder, hz: float, pid: int)`` returning what stops it (a
    callable, or an object with ``stop()`` such as the handle of
    :func:`collectors.system.start_system_collectors`). Under ``record`` it
    samples into a side trace that the parent merges into the main one.
    """

    target: str
    default_hz: float
    help: str
    min_hz: float = 0.0
    max_hz: float = float("inf")

    def check(self, name: str, hz: float) -> float:
        """Refuse a bad rate before anything starts (exit 2), not as a note afterwards."""
        if not (self.min_hz <= hz <= self.max_hz) or hz <= 0:
            low = f"at least {self.min_hz:g}" if self.min_hz > 0 else "above 0"
            raise UsageError(f"--{name}: rate must be {low} and at most {self.max_hz:g} Hz, got {hz:g}")
        return hz


#: Samplers offered as ``--<name>[=HZ]`` flags by ``record`` and ``serve``
#: (limits as in collectors.nvml.MAX_HZ / collectors.pyspy.MAX_HZ; docs/system-collectors.md).
SAMPLERS: dict[str, SamplerSpec] = {
    "nvml": SamplerSpec("collectors.system:start_nvml", 10.0,
                        "Sample GPUs with NVML (GPM on Hopper+) into the gpu table.", max_hz=100.0),
    "pyspy": SamplerSpec("collectors.system:start_pyspy", 100.0,
                         "Sample the program's Python stacks with py-spy (non-blocking) into the stacks table.",
                         min_hz=1.0, max_hz=500.0),
}


def child_env(out: Path, options: Mapping[str, Any] | None = None,
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that makes a child Python record into ``out``."""
    env = dict(os.environ if base is None else base)
    paths = [str(BOOTSTRAP_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env[ENV_DIR] = str(out.resolve())
    env[ENV_OPTIONS] = json.dumps(dict(options or {}))
    return env


# -- parent side ------------------------------------------------------------------------------
def start_samplers(rec: Any, samplers: Mapping[str, float], pid: int) -> list[Callable[[], None]]:
    """Start the samplers of :data:`SAMPLERS` named in ``samplers`` (name -> Hz) on process
    ``pid``, writing into ``rec``; returns what stops each. ``tracetool serve`` runs them in its
    own process and trace, ``tracetool record`` beside the program, into a side trace. One that
    cannot start is a note in the trace and one line on stderr; the others run."""
    stops: list[Callable[[], None]] = []
    for name, hz in samplers.items():
        spec = SAMPLERS[name]
        try:
            module, _, attr = spec.target.partition(":")
            handle = getattr(importlib.import_module(module), attr)(rec, float(hz), pid)
            # the SamplerSpec contract: a callable, or an object with stop() (SystemCollectors)
            stops.append(handle.stop if hasattr(handle, "stop") else handle)
        except Exception as e:
            rec.note(f"{name}: sampler did not start ({type(e).__name__}: {e})")
            echo(f"tracetool: {name}: sampler did not start ({e})", err=True)
    return stops


def merge_side_trace(side: Path, out: Path) -> None:
    """Move the tables of a side trace (samplers run by the parent) into ``out`` and merge its notes."""
    from tracetool.meta import read_meta
    from tracetool.schema import TABLE_FILE_RE

    side_meta = read_meta(side)
    meta = read_meta(out)

    def table_of(name: str) -> str | None:
        m = TABLE_FILE_RE.match(name)
        return m.group("table") if m else None

    present = {table_of(q.name) for q in out.iterdir()} - {None}
    for p in sorted(side.iterdir()):
        m = TABLE_FILE_RE.match(p.name)
        if m is None:
            continue
        table = m.group("table")
        # a table the program recorded too gets the sampler's rows as a later segment
        name = f"{table}-parent{m.group('suffix') or ''}.{m.group('ext')}" if table in present else p.name
        shutil.move(str(p), out / name)
    notes = list(meta.get("notes") or [])
    notes += [n for n in side_meta.get("notes") or [] if n not in notes]
    meta["notes"] = notes
    dropped = dict(meta.get("dropped_rows") or {})
    for k, v in (side_meta.get("dropped_rows") or {}).items():
        dropped[k] = dropped.get(k, 0) + v
    meta["dropped_rows"] = dropped
    for key in ("hardware", "gpus", "server_metrics"):
        if key in side_meta and key not in meta:
            meta[key] = side_meta[key]
    write_meta(out, meta)
    shutil.rmtree(side, ignore_errors=True)


def _write_empty_trace(out: Path, note: str, command: Sequence[str]) -> None:
    from tracetool.recorder import Recorder

    rec = Recorder(out, meta={"recorded_command": list(command)}).start()
    rec.note(note)
    rec.close()


def _summary(out: Path) -> str:
    from tracetool.reader import open_trace

    try:
        t = open_trace(out)
    except Exception as e:  # a cut stream is still a trace; say what is wrong
        return f"wrote {out} (unreadable: {e})"
    ids = set(t.table("tokens").column("request_id").to_pylist())
    ids |= set(t.table("spans").column("request_id").to_pylist())
    requests = len(ids - {""})
    parts = [f"{requests} requests", f"{t.rows('tokens'):,} tokens", f"{t.rows('steps'):,} steps"]
    text = f"wrote {out}: {', '.join(parts)}"
    if t.meta.get("closed") is False:
        text += " (recording not closed: the program was killed; flushed rows are readable)"
    notes = [n for n in t.meta.get("notes") or [] if n in (NO_TORCH_NOTE, NOT_LOADED_NOTE)]
    if notes:
        text += f"; {notes[0]}"
    return text


def run_recording(command: Sequence[str], out: str | os.PathLike[str], *, force: bool = False,
                  samplers: Mapping[str, float] | None = None, live: Any = None,
                  metrics: tuple[str, float] | None = None) -> int:
    """Run ``command`` with the collectors installed, recording into ``out``; returns its exit code.

    ``live`` (a :class:`tracetool.live.config.LiveConfig`) makes the program stream its trace to
    ``tracetool attach`` viewers as it is written (the token travels in the child's environment).
    ``metrics`` (URL, interval in seconds) scrapes a server's Prometheus metrics from this process
    into the trace's ``server_metrics`` table (collectors.prometheus) while the program runs.

    Raises :class:`UsageError` for an empty command, an unknown executable or a
    non-empty ``out`` without ``force``.
    """
    out = Path(out)
    if not command:
        raise UsageError("nothing to run: give the command after --, e.g. tracetool record -o trace -- python app.py")
    unknown = [n for n in (samplers or {}) if n not in SAMPLERS]
    if unknown:
        raise UsageError(f"unknown sampler {unknown[0]!r}")
    for name, hz in (samplers or {}).items():
        SAMPLERS[name].check(name, hz)
    exe = shutil.which(command[0])
    if exe is None:
        raise UsageError(f"command not found: {command[0]}")
    prepare_output(out, force, create=False)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"{out}: cannot write a trace here ({e.strerror or e})") from e
    if (out / META_FILE).exists():  # a replaced trace must not pass for this run's
        (out / META_FILE).unlink()
    options: dict[str, Any] = {"command": list(command)}
    if live is not None:
        options["live"] = {"address": live.address, "tls_cert": _opt_path(live.tls_cert),
                           "tls_key": _opt_path(live.tls_key),
                           "flush_interval_s": live.flush_interval_s}
    env = child_env(out, options)
    if live is not None and live.token:
        from tracetool.live.protocol import TOKEN_ENV

        env[TOKEN_ENV] = live.token
    try:
        child = subprocess.Popen(list(command), env=env)
    except OSError as e:
        raise UsageError(f"cannot run {command[0]}: {e.strerror or e}") from e

    side = out.parent / f".{out.name}.samplers-{os.getpid()}"
    side_rec: Any = None
    stops: list[Callable[[], None]] = []
    if samplers or metrics:
        from tracetool.recorder import Recorder

        side_rec = Recorder(side).start()
        stops = start_samplers(side_rec, samplers or {}, child.pid)
    if metrics is not None and side_rec is not None:
        from collectors.prometheus import attach_scraper

        attach_scraper(side_rec, metrics[0], clock="server", interval_s=metrics[1], first_wait_s=0.0)

    def forward(signum: int, frame: Any) -> None:
        # Ctrl-C in a terminal already reached the child (same process group): forward only
        # what was sent to this process alone.
        if signum == signal.SIGINT and _foreground_tty():
            return
        try:
            child.send_signal(signum)
        except OSError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = child.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    for stop in stops:
        try:
            stop()
        except Exception as e:
            echo(f"tracetool: sampler did not stop cleanly ({e})", err=True)
    if side_rec is not None:
        side_rec.close()
    if not (out / META_FILE).is_file():
        _write_empty_trace(out, NOT_LOADED_NOTE, command)
    if side_rec is not None:
        try:
            merge_side_trace(side, out)
        except Exception as e:
            echo(f"tracetool: sampler data not merged ({e}); it stays in {side}", err=True)
    echo(f"tracetool: {_summary(out)}", err=True)
    return 128 - rc if rc < 0 else rc


def _opt_path(p: Any) -> str | None:
    return None if p is None else str(Path(p).resolve())


def _foreground_tty() -> bool:
    try:
        fd = sys.stdin.fileno()
        return os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False


# -- child side ---------------------------------------------------------------------------------
_child: dict[str, Any] = {}


def start_in_child() -> bool:
    """Called by the bootstrap ``sitecustomize``: record this process if the parent asked.

    Consumes the environment variable, so programs this one starts do not
    record into (and wipe) the same directory.
    """
    out = os.environ.pop(ENV_DIR, None)
    options = json.loads(os.environ.pop(ENV_OPTIONS, "") or "{}")
    if not out:
        return False
    # collectors.recorder's spelling: it takes live= as the options' mapping
    from collectors.hf import autopatch
    from collectors.recorder import Recorder

    meta = {"recorded_command": options.get("command") or list(sys.argv)}
    rec = _child_recorder(Recorder, out, meta, options.get("live"))
    _child["recorder"] = rec
    autopatch(rec)
    atexit.register(finish_child)  # after the writer's own atexit: runs first (LIFO)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def _child_recorder(recorder: Any, out: str, meta: dict[str, Any], live: Any) -> Any:
    """Start the child's Recorder, streaming live when asked; a live endpoint that cannot start
    (port taken) is one line on stderr and a note, and the recording goes on without it."""
    if live:
        rec = recorder(out, meta=meta, live=dict(live))
        try:
            return rec.start()
        except Exception as e:
            echo(f"tracetool: live endpoint not started ({e}); recording without it", err=True)
            rec = recorder(out, meta=meta)
            rec.note(f"live endpoint not started: {e}")
            return rec.start()
    return recorder(out, meta=meta).start()


def finish_child() -> None:
    """Close the trace (at exit, after an exception, Ctrl-C or SIGTERM). Idempotent."""
    rec = _child.pop("recorder", None)
    if rec is None:
        return
    try:  # a second Ctrl-C must not cut the trace short while it is being closed
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except (ValueError, OSError):
        pass
    if "torch" not in sys.modules:
        rec.note(NO_TORCH_NOTE)
    rec.close()


def _on_sigterm(signum: int, frame: Any) -> None:
    finish_child()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
