"""Every command that prints a trace's text shows it escaped and cut, on stdout and stderr.

The poisoned trace (tests/untrusted/evil.py) holds the payload in request ids, span names,
stacks, an error message, meta.json notes, model and hardware names, and its folder name; one
note is 5,000,000 characters. Each command runs in-process as on a terminal (click's own
stripping of 7-bit CSI off a non-tty is turned off), and its stdout and stderr are checked:
no raw control, C1, bidi or surrogate character, the payload still recognisable, the long
note cut. ``--json`` output stays data: it parses back to the exact strings.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.fuzz.fuzzlib import run_cli
from tests.untrusted.conftest import BIG_NOTE
from tests.untrusted.evil import PAYLOAD, WORDS, check_output

pytestmark = pytest.mark.usefixtures("terminal")


def _both(r) -> str:  # type: ignore[no-untyped-def]
    return r.out + r.err


def test_info_escapes_and_cuts(evil: Path) -> None:
    r = run_cli("info", evil)
    assert r.code == 0, r.err
    check_output(_both(r), where="info")
    for word in WORDS:
        assert word in r.out
    assert "tail-of-the-big-note" not in r.out and "…[+" in r.out, "the long note is cut with a mark"
    assert len(r.out) < 50_000, f"info printed {len(r.out):,} characters for a {BIG_NOTE:,}-character note"
    assert "\\ud800" in r.out  # a lone surrogate is shown, not a UnicodeEncodeError


def test_info_json_stays_data(evil: Path) -> None:
    r = run_cli("info", "--json", evil)
    assert r.code == 0, r.err
    check_output(_both(r), where="info --json")
    doc = json.loads(r.out)
    assert f"note {PAYLOAD} end" in doc["notes"] and "surrogate \ud800 end" in doc["notes"]
    assert doc["model"]["name"] == f"model {PAYLOAD}"
    assert any(len(n) > BIG_NOTE for n in doc["notes"]), "JSON is data: nothing is cut"


@pytest.mark.parametrize("as_json", [False, True])
def test_validate(evil: Path, as_json: bool) -> None:
    r = run_cli("validate", *(["--json"] if as_json else []), evil)
    assert r.code == 0, r.err
    check_output(_both(r), where="validate")


@pytest.mark.parametrize("as_json", [False, True])
def test_analyze(evil: Path, as_json: bool) -> None:
    r = run_cli("analyze", *(["--json"] if as_json else []), evil)
    assert r.code == 0, r.err
    check_output(_both(r), where="analyze")
    if as_json:
        doc = json.loads(r.out)
        assert doc["traces"][0]["path"] == str(evil)


def test_analyze_a_dataset_shows_group_names_escaped(evil_dataset: Path) -> None:
    r = run_cli("analyze", evil_dataset)
    assert r.code == 0, r.err
    check_output(_both(r), where="analyze dataset")
    assert "pwned" in r.out


def test_diff(evil: Path, evil_root: Path) -> None:
    r = run_cli("diff", evil_root / "clean", evil)
    assert r.code == 0, r.err
    check_output(_both(r), where="diff")


def test_report_text_formats(evil: Path, tmp_path: Path) -> None:
    # the text formats are checked in test_report_formats; here: what report writes on stderr
    budget = tmp_path / "b.toml"
    budget.write_text("p95_ttft_ms = 1\n")
    r = run_cli("report", evil, "--baseline", evil, "--budget", budget)
    assert r.code == 1, r.err
    check_output(_both(r), where="report md")


def test_export_and_convert_lines(evil: Path, tmp_path: Path) -> None:
    r = run_cli("export", evil, "--perfetto", "-")
    assert r.code == 0, r.err
    check_output(_both(r), where="export to stdout")
    json.loads(r.out)  # stays valid JSON
    r = run_cli("convert", evil, "-o", tmp_path / "conv")
    assert r.code == 0, r.err
    check_output(_both(r), where="convert", shows_payload=False)  # it names only the output


def test_error_lines_from_bad_input_are_escaped(evil_root: Path, tmp_path: Path) -> None:
    missing = tmp_path / f"missing{PAYLOAD.replace('/', '').replace(chr(0), '')}"
    r = run_cli("info", missing)
    assert r.code == 3
    check_output(r.err, where="error for a missing path")
    broken = tmp_path / "broken"
    shutil.copytree(evil_root / "clean", broken)
    (broken / "meta.json").write_text(json.dumps({"format": PAYLOAD, "version": 1}))
    r = run_cli("info", broken)
    assert r.code == 3 and r.err.count("\n") == 1, r.err
    check_output(r.err, where="error for a bad meta.json")
