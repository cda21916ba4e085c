"""Fuzzing the trace readers: mutated table bytes, cut files, mutated schemas and types, meta.json.

Every input goes through ``tracetool validate`` and ``tracetool info`` in-process
(the readers every other command shares); ``convert`` and ``export`` get a
share. The property is :func:`fuzzlib.assert_clean`: exit 0 or 3, one error
line, no traceback, bounded time.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.fuzzlib import CORPUS, assert_clean, fuzz_settings, run_cli, tried
from tests.fuzz.mutators import BYTE_OPS, mutate_bytes
from tracetool.schema import TABLES

TRACES = sorted(p for p in (CORPUS / "traces").iterdir() if p.is_dir())
TABLE_FILES = sorted((t, f.name) for t in TRACES for f in t.iterdir() if f.name != "meta.json")


def _copy(src: Path) -> tuple[tempfile.TemporaryDirectory[str], Path]:
    tmp = tempfile.TemporaryDirectory(prefix="tracetool-fuzz-")
    dst = Path(tmp.name) / "trace"
    shutil.copytree(src, dst)
    return tmp, dst


def _read_all(trace: Path, campaign: str, extra: bool = False) -> None:
    """validate and info (and, with ``extra``, convert and export) on one fuzzed trace."""
    for args in (("validate", trace), ("info", "--json", trace)):
        assert_clean(run_cli(*args))
    if extra:
        out = trace.parent / "converted"
        assert_clean(run_cli("convert", trace, "--to", "parquet", "-o", out, "--force"))
        assert_clean(run_cli("export", trace, "--perfetto", trace.parent / "p.json"))
    tried(campaign)


# -- bytes --------------------------------------------------------------------------------------
#: Byte mutations plus one that writes a 32-bit length or offset field with an odd value.
OPS = st.one_of(BYTE_OPS, st.tuples(st.just("int32"), st.floats(0, 1),
                                    st.sampled_from([0, -1, 0x7FFFFFFF, 0xFFFFFFF, 8, 0x10000000])))


@fuzz_settings(1.0)
@given(st.sampled_from(TABLE_FILES), st.lists(OPS, min_size=1, max_size=6), st.booleans())
def test_mutated_table_bytes(target: tuple[Path, str], ops: list[tuple[str, float, Any]], extra: bool) -> None:
    trace, name = target
    tmp, dst = _copy(trace)
    with tmp:
        f = dst / name
        f.write_bytes(mutate_bytes(f.read_bytes(), ops))
        _read_all(dst, "table bytes", extra=extra)


def test_every_cut_of_every_file_reads_or_fails_cleanly() -> None:
    """Truncation at 64 evenly spread points of each table file (the prefix of a killed copy)."""
    for trace, name in TABLE_FILES:
        data = (trace / name).read_bytes()
        tmp, dst = _copy(trace)
        with tmp:
            for k in range(64):
                cut = len(data) * k // 64
                (dst / name).write_bytes(data[:cut])
                for args in (("validate", dst), ("info", dst)):
                    assert_clean(run_cli(*args))
                tried("cut files")


# -- schemas and types ----------------------------------------------------------------------------
def _typed(draw: Any, t: pa.DataType, n: int) -> pa.Array:
    """n values of type t, nulls and extremes included."""
    if pa.types.is_null(t):
        return pa.nulls(n)
    if pa.types.is_integer(t):
        info = (t.bit_width, pa.types.is_signed_integer(t))
        lo = -(1 << (info[0] - 1)) if info[1] else 0
        hi = (1 << (info[0] - 1)) - 1 if info[1] else (1 << info[0]) - 1
        vals = draw(st.lists(st.one_of(st.none(), st.integers(lo, hi), st.sampled_from([lo, hi, 0, -1 if lo else 0])),
                             min_size=n, max_size=n))
        return pa.array(vals, t)
    if pa.types.is_floating(t):
        vals = draw(st.lists(st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=64)),
                             min_size=n, max_size=n))
        return pa.array(vals, pa.float64()).cast(t, safe=False) if t != pa.float64() else pa.array(vals, t)
    if pa.types.is_timestamp(t) or pa.types.is_duration(t):
        vals = draw(st.lists(st.one_of(st.none(), st.integers(-(1 << 62), 1 << 62)), min_size=n, max_size=n))
        return pa.array(vals, pa.int64()).cast(t)
    if pa.types.is_boolean(t):
        return pa.array(draw(st.lists(st.one_of(st.none(), st.booleans()), min_size=n, max_size=n)), t)
    if pa.types.is_dictionary(t):
        vals = draw(st.lists(st.one_of(st.none(), st.sampled_from(["server", "client", "decode", "", "ü\x00"])),
                             min_size=n, max_size=n))
        return pa.array(vals, pa.string()).dictionary_encode()
    if pa.types.is_binary(t):
        return pa.array(draw(st.lists(st.one_of(st.none(), st.binary(max_size=8)), min_size=n, max_size=n)), t)
    if pa.types.is_list(t):
        return pa.array(draw(st.lists(st.one_of(st.none(), st.lists(st.integers(-5, 5), max_size=3)),
                                      min_size=n, max_size=n)), t)
    if pa.types.is_struct(t):
        return pa.array([{"a": i} for i in range(n)], t)
    vals = draw(st.lists(st.one_of(st.none(), st.sampled_from(["server", "client", "decode", "prefill",
                                                                "server.request", "client.request", "r1", "r2"]),
                                   st.text(max_size=6)), min_size=n, max_size=n))
    return pa.array(vals, t)


TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint32(), pa.uint64(), pa.float32(), pa.float64(),
         pa.string(), pa.large_string(), pa.dictionary(pa.int32(), pa.string()), pa.binary(), pa.bool_(),
         pa.timestamp("ns"), pa.timestamp("ms"), pa.duration("ns"), pa.null(), pa.list_(pa.int64()),
         pa.struct([("a", pa.int64())])]


@st.composite
def fuzzed_table(draw: Any) -> tuple[str, pa.Table]:
    name = draw(st.sampled_from(sorted(TABLES)))
    spec = TABLES[name]
    n = draw(st.integers(0, 6))
    cols: list[tuple[str, pa.Array]] = []
    for col in spec.columns:
        fate = draw(st.sampled_from(["keep", "keep", "keep", "drop", "retype", "rename"]))
        if fate == "drop":
            continue
        t = draw(st.sampled_from(TYPES)) if fate == "retype" else col.type
        cname = draw(st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)) if fate == "rename" else col.name
        cols.append((cname, _typed(draw, t, n)))
    for _ in range(draw(st.integers(0, 2))):  # extra columns, maybe duplicating a name
        cname = draw(st.sampled_from([c.name for c in spec.columns] + ["extra", "x"]))
        cols.append((cname, _typed(draw, draw(st.sampled_from(TYPES)), n)))
    table = pa.Table.from_arrays([a for _, a in cols], names=[c for c, _ in cols]) if cols else pa.table({})
    return name, table


def _write(path: Path, table: pa.Table, kind: str) -> None:
    if kind == "parquet":
        pq.write_table(table, path)
    elif kind == "arrow":
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
    else:
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
            w.write_table(table)


@fuzz_settings(1.0)
@given(st.lists(fuzzed_table(), min_size=1, max_size=3), st.sampled_from(["arrows", "arrow", "parquet"]),
       st.booleans())
def test_mutated_schemas_and_types(tables: list[tuple[str, pa.Table]], kind: str, segment: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="tracetool-fuzz-") as tmp:
        dst = Path(tmp) / "trace"
        dst.mkdir()
        (dst / "meta.json").write_text('{"format": "tracetool", "version": 1}')
        for i, (name, table) in enumerate(tables):
            fname = f"{name}-{i}.{kind}" if segment or (dst / f"{name}.{kind}").exists() else f"{name}.{kind}"
            try:
                _write(dst / fname, table, kind)
            except (pa.ArrowException, ValueError, TypeError):  # pyarrow cannot write this one: not an input
                continue
        _read_all(dst, "schemas and types", extra=segment)


# -- meta.json ----------------------------------------------------------------------------------
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.floats(allow_nan=False),
              st.text(max_size=12)),
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)),
    max_leaves=12)
META_KEYS = ["format", "version", "model", "hardware", "notes", "dropped_rows", "closed", "clocks", "import",
             "producer"]
MODEL_KEYS = ["name", "params", "active_params", "layers", "kv_heads", "head_dim", "weight_bytes_per_param",
              "kv_bytes_per_elem", "kv_bytes_per_token", "hidden", "vocab"]
SEED_METAS = [json.loads(p.read_text()) for p in sorted((CORPUS / "meta").glob("*.json"))]


@st.composite
def fuzzed_meta(draw: Any) -> bytes:
    how = draw(st.sampled_from(["mutate", "mutate", "mutate", "random", "text"]))
    if how == "text":
        return draw(st.binary(max_size=64))
    if how == "random":
        return json.dumps(draw(JSON)).encode()
    meta = json.loads(json.dumps(draw(st.sampled_from(SEED_METAS))))
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(META_KEYS))
        if key in ("model", "hardware") and draw(st.booleans()):
            block = meta.setdefault(key, {}) if isinstance(meta.get(key), dict) else {}
            block[draw(st.sampled_from([*MODEL_KEYS, "gpu", "gpu_count", "mem_bw_bytes_per_s", "peak_flops"]))] = \
                draw(JSON)
            meta[key] = block
        elif draw(st.booleans()):
            meta.pop(key, None)
        else:
            meta[key] = draw(JSON)
    return json.dumps(meta).encode()


@fuzz_settings(1.0)
@given(fuzzed_meta(), st.sampled_from(TRACES))
def test_mutated_meta_json(meta: bytes, trace: Path) -> None:
    tmp, dst = _copy(trace)
    with tmp:
        (dst / "meta.json").write_bytes(meta)
        _read_all(dst, "meta.json")
