"""Fuzzing what the analyses do with valid traces holding strange values.

The files are well-formed v1 traces; their values are not: timestamps at
the ends of int64, zero-length or huge spans, duplicate and out-of-order
token indexes, negative kv_len, NaN and infinite GPU readings, a model with
zero bandwidth. ``analyze --json``, ``report`` and ``export`` must answer
(exit 0 with JSON that parses) or refuse in one line (exit 3); never a
traceback. DuckDB runs on each, so this campaign is smaller than the others.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.fuzzlib import assert_clean, fuzz_settings, run_cli, tried
from tracetool.schema import TABLES

I64 = st.one_of(st.integers(0, 10**10), st.sampled_from([0, 1, -1, 2**62, 2**63 - 1, -(2**63), 10**18]))
I32 = st.one_of(st.integers(0, 5000), st.sampled_from([0, -1, 2**31 - 1, -(2**31)]))
F64 = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))
SPAN_NAMES = ["server.request", "client.request", "queue", "tokenize", "prefill", "decode", "detokenize",
              "preprocess", "postprocess", "other.thing"]


@st.composite
def value_trace(draw: Any) -> tuple[dict[str, pa.Table], dict[str, Any]]:
    rids = draw(st.lists(st.sampled_from(["a", "b", "c", ""]), min_size=1, max_size=3, unique=True))
    spans: dict[str, list[Any]] = {c.name: [] for c in TABLES["spans"].columns}
    for rid in rids:
        for name in draw(st.lists(st.sampled_from(SPAN_NAMES), max_size=6)):
            s = draw(I64)
            e = draw(st.one_of(st.just(s), I64.filter(lambda x, s=s: x >= s)))
            for k, v in zip(spans, (rid, name, s, e, "client" if name.startswith("client") else "server"),
                            strict=True):
                spans[k].append(v)
    tokens: dict[str, list[Any]] = {c.name: [] for c in TABLES["tokens"].columns}
    for rid in rids:
        for _ in range(draw(st.integers(0, 6))):
            row = (rid, draw(st.integers(0, 8)), draw(I64), draw(st.one_of(st.none(), I32)),
                   None, None, draw(st.one_of(st.none(), I32)), draw(st.one_of(st.none(), I64)), None)
            for k, v in zip(tokens, row, strict=True):
                tokens[k].append(v)
    tables = {"spans": pa.table(spans, schema=TABLES["spans"].arrow_schema),
              "tokens": pa.table(tokens, schema=TABLES["tokens"].arrow_schema)}
    if draw(st.booleans()):
        n = draw(st.integers(1, 4))
        cols = {c.name: [draw(F64) if c.kind == "float" else None for _ in range(n)]
                for c in TABLES["gpu"].columns}
        cols["ts_ns"] = [draw(I64) for _ in range(n)]
        cols["gpu"] = [draw(st.sampled_from([0, 1, -1])) for _ in range(n)]
        tables["gpu"] = pa.table(cols, schema=TABLES["gpu"].arrow_schema)
    if draw(st.booleans()):
        n = draw(st.integers(1, 4))
        tables["steps"] = pa.table({"step_id": [draw(I64) for _ in range(n)], "start_ns": [0] * n,
                                    "end_ns": [draw(I64) for _ in range(n)],
                                    "batch_size": [draw(I32) for _ in range(n)],
                                    "prefill_tokens": [draw(I32) for _ in range(n)],
                                    "decode_tokens": [draw(I32) for _ in range(n)],
                                    "kv_tokens": [draw(I64) for _ in range(n)]},
                                   schema=TABLES["steps"].arrow_schema)
    if draw(st.booleans()):
        tables["requests"] = pa.table({"request_id": rids,
                                       "prompt_tokens": [draw(st.one_of(st.none(), I32)) for _ in rids],
                                       "output_tokens": [draw(st.one_of(st.none(), I32)) for _ in rids],
                                       "status": [draw(st.sampled_from(["ok", "error", None, "?"])) for _ in rids],
                                       "error": [None] * len(rids), "prompt_chars": [None] * len(rids),
                                       "cached_prompt_tokens": [draw(st.one_of(st.none(), I32)) for _ in rids],
                                       "reasoning_tokens": [draw(st.one_of(st.none(), I32)) for _ in rids],
                                       "server_scope": [draw(st.sampled_from(["server", "engine", None, "?"]))
                                                        for _ in rids]},
                                      schema=TABLES["requests"].arrow_schema)
    meta: dict[str, Any] = {"format": "tracetool", "version": 1}
    if draw(st.booleans()):
        num = st.one_of(st.integers(0, 10**15), st.sampled_from([0, 1e300, 5e-324]))
        meta["model"] = {k: draw(num) for k in ("params", "layers", "kv_heads", "head_dim",
                                                "weight_bytes_per_param", "kv_bytes_per_elem")}
        meta["hardware"] = {"gpu": "H100 SXM", "gpu_count": draw(st.sampled_from([0, 1, 8])),
                            "mem_bw_bytes_per_s": draw(num), "peak_flops": draw(num)}
    return tables, meta


def _stream(path: Path, table: pa.Table) -> None:
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)


@fuzz_settings(0.25, floor=12)
@given(value_trace())
def test_analyses_answer_or_refuse(case: tuple[dict[str, pa.Table], dict[str, Any]]) -> None:
    tables, meta = case
    with tempfile.TemporaryDirectory(prefix="tracetool-fuzz-") as tmp:
        trace = Path(tmp) / "t"
        trace.mkdir()
        (trace / "meta.json").write_text(json.dumps(meta))
        for name, table in tables.items():
            _stream(trace / f"{name}.arrows", table)
        r = run_cli("analyze", "--json", trace)
        assert_clean(r)
        if r.code == 0:
            json.loads(r.out, parse_constant=_refuse)  # strict JSON: NaN or Infinity do not parse everywhere
        r = run_cli("report", trace, "--format", "json", "-o", Path(tmp) / "r.json")
        assert_clean(r, allowed=(0, 1, 3))
        if r.code != 3:
            json.loads((Path(tmp) / "r.json").read_text(), parse_constant=_refuse)
        r = run_cli("export", trace, "--perfetto", Path(tmp) / "p.json")
        assert_clean(r)
        if r.code == 0:
            json.loads((Path(tmp) / "p.json").read_text(), parse_constant=_refuse)
    tried("analysis of odd values")


def _refuse(name: str) -> Any:
    raise AssertionError(f"{name} in a JSON output")
