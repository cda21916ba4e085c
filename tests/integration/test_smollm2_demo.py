"""``tracetool demo --model smollm2``: the main command on the real model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_tracetool
from tests.integration.conftest import PERSISTENT_CACHE
from tracetool.reader import open_trace

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_demo_serves_smollm2(tmp_path: Path, smollm2_dir: Path) -> None:
    out = tmp_path / "demo"
    r = run_tracetool("demo", "--model", "smollm2", "--json", "-o", out, "-n", "3", "--concurrency", "3",
                      "--max-tokens", "6", timeout=300, env={"TRACETOOL_CACHE": str(PERSISTENT_CACHE)})
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["requests"] == 3 and doc["failed_requests"] == 0  # analyze --json's document
    assert "(SmolLM2-135M-Instruct, loopback" in r.stderr  # no rebuild: the cached directory is served
    t = open_trace(out)
    assert t.meta["model"]["name"] == "SmolLM2-135M-Instruct" and t.meta["merge"]["joined"] == 3
    assert t.meta["probe"]["prompt_file"] is not None  # real questions, not random words
    assert doc["components"]["decode"]["ms"] > 0
    # the HTML page of a real model's trace: every section with the data is drawn
    pytest.importorskip("matplotlib", reason="the html extra (matplotlib) is not installed")
    page = tmp_path / "demo.html"
    rep = run_tracetool("report", out, "--html", page, "-o", tmp_path / "demo.md", timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    text = page.read_text()
    for section in ("verdict", "waterfalls", "distributions", "decode"):
        assert f'<section id="{section}" data-absent="false">' in text, section
    assert "](demo.html)" in (tmp_path / "demo.md").read_text()
