"""Headless layer of the TUI: the data source, the analysed snapshot, the diagnosis rows, the verdicts.

No textual here; these run on the analyzers' real output over real trace directories.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tui_traces import bad_trace

from analyzers.options import AnalysisOptions
from tracetool.errors import BadInput, TraceFormatError, UsageError
from tracetool.trace_source import DirectorySource, TraceSource
from tracetool.tui.model import ALL, analyse
from tracetool.tui.story import SUSPECTS, diagnosis, judge, stories


def test_directory_source_is_a_trace_source(chat: Path) -> None:
    src = DirectorySource([chat])
    assert isinstance(src, TraceSource)
    assert not src.live and src.status() == "file"
    traces = src.snapshot()
    assert [t.name for t in traces] == ["chat"] and src.label == "chat"
    assert src.snapshot()[0] is traces[0], "a finished recording is read once"
    assert src.reload()[0] is not traces[0], "reload reads the files again"
    src.close()


def test_directory_of_traces_expands(traces: Path) -> None:
    src = DirectorySource([traces])
    assert sorted(t.name for t in src.snapshot()) == ["chat", "xregion"]
    assert src.label == "2 traces"


def test_bad_traces_fail_on_open(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="no such file"):
        DirectorySource([tmp_path / "missing"]).open()
    with pytest.raises(TraceFormatError, match=r"tokens\.arrows"):
        DirectorySource([bad_trace(tmp_path / "bad")]).open()
    with pytest.raises(BadInput):
        DirectorySource([])


def test_source_module_stays_headless() -> None:
    code = ("import sys, json\nimport tracetool.trace_source, tracetool.tui, tracetool.tui.model, tracetool.tui.story\n"
            "print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out.strip().splitlines()[-1]))
    assert not loaded & {"textual", "duckdb", "torch", "pandas"}, loaded & {"textual", "duckdb", "torch", "pandas"}


def test_reading_and_analysing_never_import_pandas(chat: Path) -> None:
    """pandas costs ~0.4 s of the first paint; pyarrow imports it on any Python-to-Arrow conversion."""
    code = ("import sys\nfrom tracetool.trace_source import DirectorySource\nfrom tracetool.tui.model import "
            "analyse\nfrom analyzers.options import AnalysisOptions\n"
            f"analyse(DirectorySource([{str(chat)!r}]), AnalysisOptions())\n"
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_snapshot_has_one_view_per_trace_and_all(traces: Path, chat: Path, snap: Any) -> None:
    one = snap(chat)
    assert one is not None and one.labels == ["chat"]
    both = analyse(DirectorySource([traces]), AnalysisOptions(), generation=7)
    assert both is not None and both.labels == [ALL, "chat", "xregion"] and both.generation == 7
    assert both.view(ALL).doc["requests"] == 20
    assert both.view("xregion").doc["bottleneck"] == "network"
    assert both.view("gone").label == ALL, "a view that disappeared falls back to the first"


def test_a_live_tick_analyses_only_the_view_shown(traces: Path) -> None:
    """only=: the combined view alone, or one trace alone, with every choice still listed."""
    src = DirectorySource([traces])
    combined = analyse(src, AnalysisOptions(), only=ALL)
    assert combined is not None and list(combined.views) == [ALL]
    assert combined.labels == [ALL, "chat", "xregion"] and combined.view(ALL).doc["requests"] == 20
    one = analyse(src, AnalysisOptions(), only="xregion")
    assert one is not None and list(one.views) == ["xregion"] and one.labels == [ALL, "chat", "xregion"]
    full = analyse(src, AnalysisOptions())
    assert full is not None
    def body(doc: Any, path: str = "") -> dict[str, Any]:
        """Leaves by path, floats to 9 significant digits (summation order moves the last bits)."""
        if isinstance(doc, dict):
            return {k: v for key, item in doc.items() if key != "traces"
                    for k, v in body(item, f"{path}.{key}").items()}
        if isinstance(doc, list):
            return {k: v for i, item in enumerate(doc) for k, v in body(item, f"{path}[{i}]").items()}
        return {path: float(f"{doc:.9g}") if isinstance(doc, float) else doc}

    assert body(one.view("xregion").doc) == body(full.view("xregion").doc)
    assert body(combined.view(ALL).doc) == body(full.view(ALL).doc)


def test_every_story_is_judged_up_front(chat: Path, snap: Any) -> None:
    rows = snap(chat).view(None).analysis.rows("claims")
    assert sorted(r["key"] for r in rows if r["scope"] is None) == sorted(s.key for s in stories())
    # and every story about a tail (the hypothesis dialog judges "p99 TTFT is the network" on that tail)
    from analyzers.params import tail_claims

    assert sorted(f"{r['scope'].split('-')[0]}-{r['scope'].split('-')[1]}={r['key']}" for r in rows
                  if r["scope"] is not None) == sorted(tail_claims())


def test_diagnosis_on_a_decode_dominant_chat(chat: Path, snap: Any) -> None:
    rows = {r.name: r for r in diagnosis(snap(chat).view(None))}
    # every row a claim judges, then the rows without a claim whose findings fired
    assert [n for n in rows if rows[n].verdict is not None] == [s.name for s in SUSPECTS if s.claims]
    assert (rows["decode"].verdict, rows["decode"].badge) == ("supported", "✓")
    assert rows["decode"].share is not None and rows["decode"].share > 0.9
    assert (rows["network RTT"].verdict, rows["network RTT"].badge) == ("misdiagnosis", "✗")
    assert "the bottleneck is decode" in rows["network RTT"].evidence
    assert "network-not-bottleneck" in [f["id"] for f in rows["network RTT"].findings]
    assert rows["tokenizer"].verdict == "misdiagnosis"
    prepost = rows["pre/post-processing"]
    assert prepost.verdict == "misdiagnosis" and "preprocess not measured" in prepost.evidence


def test_diagnosis_flips_on_a_cross_region_trace(xregion: Path, snap: Any) -> None:
    rows = {r.name: r for r in diagnosis(snap(xregion).view(None))}
    assert rows["network RTT"].verdict == "supported"
    assert rows["network RTT"].findings and rows["network RTT"].findings[0]["severity"] == "warning"
    assert rows["decode"].verdict in ("contributing", "misdiagnosis")


@pytest.mark.parametrize(("words", "key", "chat_verdict", "xregion_verdict"), [
    ("it's the network", "network", "misdiagnosis", "supported"),
    ("It's tokenizer overhead.", "tokenize", "misdiagnosis", "misdiagnosis"),
    ("decode is compute-bound", "compute-bound", "misdiagnosis", "unmeasured"),
    ("the server does thousands of tok/s", "throughput", "misdiagnosis", "supported"),
])
def test_judge_reads_the_analyzers_verdict(chat: Path, xregion: Path, snap: Any, words: str, key: str,
                                           chat_verdict: str, xregion_verdict: str) -> None:
    for path, expected in ((chat, chat_verdict), (xregion, xregion_verdict)):
        view = snap(path).view(None)
        v = judge(view, words)
        row = view.claim(key)
        assert v.key == key and v.verdict == expected == row["verdict"] and v.detail == row["detail"]


def test_judge_unknown_words_is_a_usage_error(chat: Path, snap: Any) -> None:
    with pytest.raises(UsageError):
        judge(snap(chat).view(None), "it's the moon")


def test_model_and_gpu_options_reach_the_roofline(xregion: Path, snap: Any) -> None:
    plain = snap(xregion)
    with_hw = snap(xregion, model="llama-3.1-8b", gpu="h100-sxm")
    assert plain is not None and with_hw is not None
    assert plain.view(None).doc["decode"]["roofline"] is None
    assert with_hw.view(None).doc["decode"]["roofline"]["gpu"] == "H100 SXM"
