"""Shared test helpers: write traces with plain pyarrow, run the CLI in-process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tracetool.cli import main as cli_main

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def _tokenizer_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Tests (and the processes they start) never write the user's ~/.cache: the demo tokenizer
    is built once per session into a temporary ``TRACETOOL_CACHE``."""
    path = tmp_path_factory.mktemp("tracetool-cache")
    old = os.environ.get("TRACETOOL_CACHE")
    os.environ["TRACETOOL_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("TRACETOOL_CACHE", None)
    else:
        os.environ["TRACETOOL_CACHE"] = old


def write_table(path: Path, table: pa.Table, kind: str) -> None:
    """Write ``table`` as an Arrow IPC stream (arrows), IPC file (arrow) or Parquet."""
    if kind == "parquet":
        pq.write_table(table, path)
    elif kind == "arrow":
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
    else:
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
            w.write_table(table)


def make_trace(directory: Path, tables: Mapping[str, pa.Table | Mapping[str, Any]],
               meta: Mapping[str, Any] | None = None, kind: str = "arrows") -> Path:
    """A trace written with nothing but pyarrow, the way a third party would."""
    directory.mkdir(parents=True, exist_ok=True)
    body = {"format": "tracetool", "version": 1}
    body.update(meta or {})
    (directory / "meta.json").write_text(json.dumps(body))
    for name, t in tables.items():
        table = t if isinstance(t, pa.Table) else pa.table(dict(t))
        write_table(directory / f"{name}.{kind}", table, kind)
    return directory


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def anyio_backend() -> str:
    """The async tests (``pytest.mark.anyio``: Textual's Pilot) run on asyncio, Textual's own loop."""
    return "asyncio"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run ``tracetool ARGS`` in-process; returns exit code, stdout and stderr."""

    def run(*args: Any) -> CliResult:
        capsys.readouterr()
        code = cli_main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture(scope="session")
def tail_runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tail scenarios (tests/analyzers/tail_scenarios.CASES), each written and analysed on first use
    and kept for the session (tests/tail_runs.py): every surface of the tail is compared with them."""
    from tests.tail_runs import TailRuns

    return TailRuns(tmp_path_factory.mktemp("tail-scenarios"))


def run_tracetool(*args: Any, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run the real console entry point in a subprocess (for tracebacks, signals, exit codes)."""
    env = dict(os.environ)
    env.update(kw.pop("env", {}))
    return subprocess.run([sys.executable, "-m", "tracetool", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, **kw)


def spans_table(rows: list[tuple[str, str, int, int, str]]) -> pa.Table:
    r, n, s, e, c = zip(*rows, strict=True) if rows else ((), (), (), (), ())
    return pa.table({"request_id": pa.array(r, pa.string()), "name": pa.array(n, pa.string()),
                     "start_ns": pa.array(s, pa.int64()), "end_ns": pa.array(e, pa.int64()),
                     "clock": pa.array(c, pa.string())})
