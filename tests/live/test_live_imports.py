"""Import hygiene: the live modules stay headless, and a recording host never loads gRPC."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _loaded(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True).stdout.splitlines()[-1]
    return set(json.loads(out))


@pytest.mark.parametrize("module", ["tracetool.live.client", "tracetool.live.source", "tracetool.live.window",
                                    "tracetool.live.headless", "tracetool.live.server", "tracetool.live.sidecar",
                                    "tracetool.cli.attach_cmd"])
def test_live_modules_load_no_ui_or_sql(module: str) -> None:
    top = {m.split(".")[0] for m in _loaded(f"import {module}")}
    assert not top & {"textual", "duckdb", "torch", "pandas"}


def test_parsing_an_address_loads_nothing_heavy() -> None:
    assert "pyarrow" not in {m.split(".")[0] for m in _loaded("import tracetool.cli.attach_cmd")}


def test_a_recording_host_never_loads_grpc(tmp_path) -> None:
    loaded = _loaded("from collectors.recorder import Recorder\n"
                     f"rec = Recorder({str(tmp_path / 'a')!r}).start(); rec.close()\n"
                     f"rec = Recorder({str(tmp_path / 'b')!r}, live='127.0.0.1:0').start(); rec.close()")
    assert "pyarrow._flight" not in loaded and "tracetool.live.server" not in loaded
    assert "tracetool.live.sidecar" in loaded


def test_live_source_is_a_trace_source_that_trace_source_does_not_load() -> None:
    """LiveSource lives in tracetool.live, which imports tracetool.trace_source (never the other way:
    the import graph has no cycles, tests/test_layers.py)."""
    import tracetool.trace_source as source_mod
    from tracetool.live.source import LiveSource

    assert not hasattr(source_mod, "LiveSource")
    src = LiveSource(["127.0.0.1:1"])
    assert isinstance(src, source_mod.TraceSource) and src.live and src.refresh_s == 0.2
    assert src.label == "127.0.0.1:1" and src.snapshot() == []
    src.close()
    top = _loaded("import tracetool.trace_source")
    assert "tracetool.live.source" not in top and "pyarrow._flight" not in top
