"""Broken streams are failures: empty, unfinished, error-carrying or cut streams never count ok.

The servers are uvicorn apps streaming what real servers send (tests/serving/openai_doubles.py);
the probe is run as a user runs it, and its trace goes through ``tracetool analyze``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.serving.openai_doubles import UvicornThread, app
from tracetool.reader import open_trace


@pytest.fixture(scope="module")
def double() -> Iterator[UvicornThread]:
    with UvicornThread(app()) as s:
        yield s


@pytest.mark.parametrize(("model", "reason"), [
    ("interrupted", "empty stream: no content token (no finish_reason)"),
    ("no-finish", "stream ended without a finish_reason"),
    ("error-event", "server error in stream: out of KV cache blocks"),
    ("cut", "connection closed mid-stream"),
    ("abort", "the server ended the answer with finish_reason abort"),
])
def test_a_broken_stream_is_an_error_with_one_line_reason(model: str, reason: str, double: UvicornThread,
                                                          cli: Any, tmp_path: Path) -> None:
    r = cli("probe", double.url, "--model", model, "-n", 3, "--concurrency", 1, "-q", "--json",
            "-o", tmp_path / "t")
    assert r.code == 0, r.err
    rep = json.loads(r.out)
    assert (rep["ok"], rep["failed"]) == (0, 3), rep
    assert [e["error"].startswith(reason) for e in rep["errors"]] == [True], rep["errors"]
    assert "\n" not in rep["errors"][0]["error"]
    rows = open_trace(tmp_path / "t").table("requests").to_pylist()
    assert [row["status"] for row in rows] == ["error"] * 3


def test_fewer_tokens_than_asked_with_finish_reason_length_is_fine(double: UvicornThread, cli: Any,
                                                                    tmp_path: Path) -> None:
    r = cli("probe", double.url, "--model", "short", "-n", 2, "--max-tokens", 8, "-q", "--json")
    assert r.code == 0, r.err
    rep = json.loads(r.out)
    assert (rep["ok"], rep["failed"], rep["output_tokens"]) == (2, 0, 4), rep


def test_the_summary_counts_them_and_analyze_leaves_them_out(double: UvicornThread, cli: Any,
                                                             tmp_path: Path) -> None:
    """One good request and two interrupted ones (what llama-cpp-python's server did to 11 of 12)."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    assert cli("probe", double.url, "--model", "short", "-n", 1, "-q", "-o", good).code == 0
    r = cli("probe", double.url, "--model", "interrupted", "-n", 2, "-q", "-o", bad)
    assert r.code == 0 and "0 ok, 2 failed of 2" in r.out, r.out
    assert "failed x2: empty stream: no content token" in r.out
    a = cli("analyze", good, bad, "--json")
    assert a.code == 0, a.err
    doc = json.loads(a.out)
    assert (doc["requests"], doc["failed_requests"]) == (3, 2)
    assert doc["ttft_ms"]["n"] == doc["e2e_ms"]["n"] == 1  # percentiles over the good request only
    failed = next(f for f in doc["findings"] if f["id"] == "failed-requests")
    assert failed["detail"].startswith("2 of 3 requests failed")


def test_the_double_is_what_the_official_client_reads(double: UvicornThread) -> None:
    """The doubles speak the OpenAI stream format: the official client parses every behaviour,
    and sees exactly the defect each one carries (so the probe is judged on real shapes)."""
    client = openai.OpenAI(base_url=double.url, api_key="x", max_retries=0)
    seen: dict[str, tuple[str, Any]] = {}
    for model in ("interrupted", "no-finish", "abort", "short", "llama-server"):
        text, finish = "", None
        for ch in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                 stream=True, stream_options={"include_usage": True}):
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
        seen[model] = (text, finish)
    assert seen == {"interrupted": ("", None), "no-finish": ("ab", None), "abort": ("ab", "abort"),
                    "short": ("ab", "length"), "llama-server": (" w0 w1 w2 w3", "length")}
