"""Malformed input: one clear line on stderr and exit 3, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_tracetool

FIX = Path(__file__).parent / "fixtures"

CASES = [
    ("vllm-bench", "bad_vllm_truncated.json", "not valid JSON", "truncated"),
    ("vllm-bench", "bad_vllm_mismatched_lengths.json", "disagree in length", "itls 7"),
    ("vllm-bench", "bad_vllm_no_detail.json", "no ttfts or itls", "--save-detailed"),
    ("vllm-bench", "bad_vllm_empty_lists.json", "no requests", "ttfts is empty"),
    ("vllm-bench", "bad_vllm_ttfts_not_list.json", '"ttfts" is a string', "expected a list"),
    ("vllm-bench", "bad_top_level_list.json", "top level is a list", "one object"),
    ("vllm-bench", "empty.json", "empty file", "vLLM"),
    ("vllm-bench", "aiperf_profile_export.jsonl", "not valid JSON", "JSON Lines"),
    ("genai-perf", "bad_genai_perf_no_experiments.json", 'no "experiments"', "found keys"),
    ("genai-perf", "bad_genai_perf_empty.json", "no requests", "empty"),
    ("genai-perf", "vllm_bench_serve.json", 'no "experiments"', "GenAI-Perf"),
    ("genai-perf", "bad_vllm_truncated.json", "not valid JSON", "GenAI-Perf"),
    ("genai-perf", "empty.json", "empty file", "GenAI-Perf"),
    ("aiperf", "bad_aiperf_aggregate.json", "no usable AIPerf record", "profile_export_aiperf.json"),
    ("aiperf", "empty.json", "empty file", "AIPerf"),
    ("aiperf", "vllm_bench_serve.json", "no usable AIPerf record", "no metadata"),
]


@pytest.mark.parametrize(("source", "name", "what", "detail"), CASES)
def test_bad_file_is_one_line_and_exit_3(cli, tmp_path: Path, source: str, name: str, what: str,
                                         detail: str) -> None:
    r = cli("import", source, FIX / name, "-o", tmp_path / "out")
    assert r.code == 3
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracetool: error: ")
    assert str(FIX / name) in lines[0] and what in lines[0] and detail in lines[0]
    assert r.out == ""
    assert not (tmp_path / "out").exists()  # nothing half-written


@pytest.mark.parametrize("source", ["vllm-bench", "genai-perf", "aiperf"])
def test_missing_file_and_directory(cli, tmp_path: Path, source: str) -> None:
    r = cli("import", source, tmp_path / "nope.json", "-o", tmp_path / "out")
    assert r.code == 3 and "no such file" in r.err
    r = cli("import", source, FIX, "-o", tmp_path / "out")
    assert r.code == 3 and "is a directory" in r.err and len(r.err.strip().splitlines()) == 1


def _write(tmp_path: Path, name: str, body: object) -> Path:
    p = tmp_path / name
    p.write_text(body if isinstance(body, str) else json.dumps(body))
    return p


WRONG_SHAPES = [
    ("genai-perf", {"experiments": {"requests": []}}, '"experiments" is a object'),
    ("genai-perf", {"experiments": [{"experiment": {"mode": "concurrency", "value": 1}}]}, 'no "requests" list'),
    ("genai-perf", {"experiments": [{"requests": [{"timestamp": -5, "response_timestamps": []}]}]},
     "timestamp is negative"),
    ("genai-perf", {"experiments": [{"requests": [{"timestamp": 10, "response_timestamps": [5],
                                                  "response_outputs": [{"text_output": "x"}]}]}]},
     "before the request timestamp"),
    ("vllm-bench", {"ttfts": [float("nan")], "itls": [[0.01]]}, "ttft is nan"),
    ("vllm-bench", {"ttfts": [True], "itls": [[0.01]]}, "ttft is a boolean"),
    ("vllm-bench", {"ttfts": [0.1], "itls": [[1e300]]}, "itl is too large"),
    ("aiperf", '[1, 2]\n"x"\n', "record is a list"),
    ("aiperf", '{"metadata": {"request_start_ns": 5}, "metrics": {"request_latency": 3}, "error": null}\n',
     "expected {value, unit}"),
    ("aiperf", '{"metadata": {"request_start_ns": NaN}, "metrics": {}, "error": null}\n', "request_start_ns is nan"),
]


@pytest.mark.parametrize(("source", "body", "reason"), WRONG_SHAPES)
def test_wrong_types_and_values(cli, tmp_path: Path, source: str, body: object, reason: str) -> None:
    path = _write(tmp_path, "in.json", body)
    r = cli("import", source, path, "-o", tmp_path / "out")
    assert r.code == 3, r.err
    assert len(r.err.strip().splitlines()) == 1 and reason in r.err


def test_no_traceback_from_the_real_entry_point(tmp_path: Path) -> None:
    bad = _write(tmp_path, "bad.json", '{"ttfts": [0.1, 0.2], "itls": [[0.01]]')
    p = run_tracetool("import", "vllm-bench", bad, "-o", tmp_path / "out")
    assert p.returncode == 3
    assert "Traceback" not in p.stderr and p.stderr.count("\n") == 1


def test_vllm_appended_results_are_named(cli, tmp_path: Path) -> None:
    """`vllm bench serve --append-result` appends one result object per line to the same file."""
    one = (FIX / "vllm_bench_serve.json").read_text().strip()
    path = _write(tmp_path, "appended.json", one + "\n" + one)
    r = cli("import", "vllm-bench", path, "-o", tmp_path / "out")
    assert r.code == 3 and "holds 2 results appended with --append-result" in r.err
