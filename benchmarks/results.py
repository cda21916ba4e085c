"""A benchmark's result file: ``benchmarks/results/<name>.json``, from which
``benchmarks/render_results.py`` renders ``benchmarks/RESULTS.md``.

Every benchmark ends with :func:`write`: the command that ran, the machine, the
date, the commit, and its figures, each with its interval where it has one, its
target and whether the target was met. The page is generated from these files;
their history (and so the history of every figure) is ``git log`` of this
directory.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO = RESULTS_DIR.parent.parent
SCHEMA = 1


@dataclass
class Figure:
    """One measured figure.

    Attributes:
        what: what was measured, in a few words ("collectors, share of a decode step").
        value: the figure; None when the run found none (no level met the figure's condition).
        unit: its unit ("%", "µs", "x", "rows/s", "s", "MB", ...).
        interval: a 95 % interval (low, high) where the benchmark computes one.
        target: the target in words ("≤ 1 %"), or None for a figure reported without one.
        met: whether the target was met (judged on the interval's far end where there is one).
        interval_is: what ``interval`` is when it is not a 95 % interval ("min-max of 5 runs").
    """

    what: str
    value: float | None
    unit: str
    interval: tuple[float, float] | None = None
    target: str | None = None
    met: bool | None = None
    interval_is: str | None = None


def machine() -> str:
    """This machine in a line: CPUs, their model, Python, and torch when it is imported."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    parts = [f"{os.cpu_count()} CPUs ({cpu})", f"Python {platform.python_version()}"]
    torch = sys.modules.get("torch")
    if torch is not None:
        gpu = ""
        try:
            if torch.cuda.is_available():
                gpu = f", {torch.cuda.get_device_name(0)}"
        except Exception:
            pass
        parts.append(f"torch {torch.__version__}{gpu}")
    return ", ".join(parts)


#: What a benchmark measures: a change under these paths (not yet committed) marks the commit
#: ``+changes``; edits to tests, docs or other results do not.
CODE_PATHS = ("tracetool", "collectors", "analyzers", "benchmarks", "scripts", "pyproject.toml",
              ":!benchmarks/results", ":!benchmarks/RESULTS.md")


def commit() -> str:
    """The short commit of the checkout, with ``+changes`` when the code differs from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (head or "unknown") + ("+changes" if dirty else "")


def write(name: str, figures: list[Figure], *, command: str | None = None, note: str | None = None,
          out: Path | None = None, table: dict[str, list[Any]] | None = None) -> Path:
    """Write ``results/<name>.json`` (or ``out``) for this run and return its path.

    ``command`` defaults to the command line this process was started with. ``table``: a table of
    its own on the results page (``{"columns": [...], "rows": [[...], ...]}``, cells as text), for a
    benchmark whose figures read best side by side (one row per trace shape, say).
    """
    if command is None:
        argv = [Path(sys.argv[0]).as_posix()] if sys.argv and sys.argv[0] else []
        try:
            argv = [Path(sys.argv[0]).resolve().relative_to(REPO).as_posix()]
        except (ValueError, IndexError):
            pass
        command = "python " + shlex.join(argv + sys.argv[1:])
    body: dict[str, Any] = {
        "schema": SCHEMA, "benchmark": name, "command": command, "machine": machine(),
        "date": _dt.date.today().isoformat(), "commit": commit(),
        # the machine's load when the run ended (1, 5, 15 min): on a shared machine it moves figures
        "load": [round(x, 2) for x in os.getloadavg()],
        "figures": [_figure(f) for f in figures]}
    if note:
        body["note"] = note
    if table is not None:
        body["table"] = {"columns": list(table["columns"]), "rows": [list(map(str, r)) for r in table["rows"]]}
    path = out or RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=1, ensure_ascii=False) + "\n")
    print(f"result written to {path}", file=sys.stderr)
    return path


def _figure(f: Figure) -> dict[str, Any]:
    d = asdict(f)
    if f.interval_is is None:
        del d["interval_is"]
    if f.interval is not None:
        d["interval"] = [float(f.interval[0]), float(f.interval[1])]
    d["value"] = None if f.value is None else float(f.value)
    return d
