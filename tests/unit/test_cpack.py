"""The C batch packer (tracetool/_cpack.c) against the numpy path: built where it can be, the same
record batch for the same rows (nulls, int32 values that do not fit, codes the interner forgot,
any text), the numpy path when it cannot, and the writer's uncompressed messages byte for byte
what an Arrow stream writer writes."""

from __future__ import annotations

import array
import ctypes
import os
import shlex
import shutil
import sysconfig
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracetool.writer as writer
from tracetool.schema import INT_NULL, TABLES
from tracetool.writer import Interner, PackedSink, RowSink

PACKED = sorted(name for name, t in TABLES.items() if all(c.kind != "float" for c in t.columns))
ROWS = sorted(set(TABLES) - set(PACKED))


def test_the_c_packer_is_built_where_a_compiler_is() -> None:
    if os.environ.get("TRACETOOL_PURE_PYTHON"):
        pytest.skip("TRACETOOL_PURE_PYTHON asks for the numpy path")
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) here: the install skipped the optional C packer")
    assert writer._cpack is not None, f"{cc} is here but tracetool._cpack was not built: pip install -e . builds it"


@pytest.fixture
def cpack() -> Any:
    if writer._cpack is None:
        pytest.skip("the C batch packer is not built here (no C compiler at install, or TRACETOOL_PURE_PYTHON)")
    return writer._cpack


def _both(sink: PackedSink, monkeypatch: pytest.MonkeyPatch) -> tuple[pa.RecordBatch | None, pa.RecordBatch | None]:
    """The pending rows drained by the C packer and, from a copy, by the numpy path."""
    copy = array.array("q", sink.buf)
    c = sink._c_batch(sink.buf[:]) if len(sink.buf) else None
    with monkeypatch.context() as m:
        m.setattr(writer, "_cpack", None)
        sink.buf = copy
        py = sink._drain_rows()
    return c, py


TEXTS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@given(data=st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@pytest.mark.parametrize("name", PACKED)
def test_the_c_packer_builds_what_the_numpy_path_builds(name: str, data: Any, cpack: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    table = TABLES[name]
    interner = Interner()
    codes = [interner.code(s) for s in data.draw(st.lists(TEXTS, min_size=1, max_size=6, unique=True))]
    forgotten = interner.code("forgotten")
    interner.retire(forgotten)
    interner.collect()
    interner.collect()  # now unknown to the interner: a null, as in a late row of a retired request
    ints = st.one_of(st.just(INT_NULL), st.integers(-(1 << 63) + 1, (1 << 63) - 1),
                     st.integers(-(1 << 31) - 2, (1 << 31) + 1), st.integers(-5, 5))
    strs = st.one_of(st.just(INT_NULL), st.just(forgotten), st.sampled_from(codes))
    row = st.tuples(*[strs if c.kind == "string" else ints for c in table.columns])
    rows = data.draw(st.lists(row, min_size=1, max_size=80))
    sink = PackedSink(table, 10_000, interner)
    for r in rows:
        sink.buf.frombytes(sink.pack(*r))
    c, py = _both(sink, monkeypatch)
    assert c is not None, "the C packer gave up on rows the numpy path converts"
    assert py is not None
    c.validate(full=True)
    assert c.schema.equals(py.schema)
    assert c.equals(py), (c.to_pylist(), py.to_pylist())
    assert [a.null_count for a in c.columns] == [a.null_count for a in py.columns]


def _tuple_batches(sink: RowSink, rows: list[tuple[Any, ...]], cpack: Any,
                   monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, bool]:
    """The rows drained with the C packer and with the Python path (a batch, or the type of the
    exception the drain raised), and whether the C packer built its batch itself (else it gave
    up and the Python path did it)."""
    calls: list[int] = []

    class Spy:  # the real packer, counting the batches it built
        def __getattr__(self, name: str) -> Any:
            return getattr(cpack, name)

        @staticmethod
        def pack_tuples(*a: Any) -> int:
            n = int(cpack.pack_tuples(*a))
            calls.append(n)
            return n

    def drain() -> Any:
        sink.rows = list(rows)
        try:
            return sink._drain_rows()
        except Exception as e:  # the Python path cannot convert it either: the flusher drops it
            return type(e)

    with monkeypatch.context() as m:  # undone per call: hypothesis runs many examples per test
        m.setattr(writer, "_cpack", Spy())
        c = drain()
        m.setattr(writer, "_cpack", None)
        py = drain()
    return c, py, bool(calls)


@given(data=st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@pytest.mark.parametrize("name", ROWS)
def test_the_c_packer_builds_row_tuples_as_the_python_path_does(name: str, data: Any, cpack: Any,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    table = TABLES[name]
    values = {
        "int": st.one_of(st.none(), st.integers(-(1 << 31), (1 << 31) - 1), st.booleans()),
        "float": st.one_of(st.none(), st.floats(allow_nan=False), st.integers(-(1 << 53), 1 << 53)),
        "string": st.one_of(st.none(), TEXTS),
    }
    if any(c.type == pa.int64() for c in table.columns):
        values["int64"] = st.one_of(st.none(), st.integers(-(1 << 63), (1 << 63) - 1))
    row = st.tuples(*[values["int64" if c.type == pa.int64() else c.kind] for c in table.columns])
    rows = data.draw(st.lists(row, min_size=1, max_size=40))
    c, py, built = _tuple_batches(RowSink(table, 10_000), rows, cpack, monkeypatch)
    assert built, "the C packer gave up on plain Python values"
    assert isinstance(c, pa.RecordBatch) and isinstance(py, pa.RecordBatch)
    c.validate(full=True)
    assert c.schema.equals(py.schema)
    assert c.to_pylist() == py.to_pylist()
    assert [a.null_count for a in c.columns] == [a.null_count for a in py.columns]


@pytest.mark.parametrize("odd", ["numpy scalar", "float for an int", "int32 that does not fit", "str for a float"])
def test_a_value_the_c_packer_does_not_take_leaves_the_flush_to_the_python_path(
        odd: str, cpack: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    table = TABLES["gpu"]
    row: list[Any] = [1_000, 0] + [None] * (len(table.columns) - 2)
    if odd == "numpy scalar":
        row[2] = np.float32(55.5)
        row[0] = np.int64(1_000)
    elif odd == "float for an int":
        row[1] = 1.0
    elif odd == "int32 that does not fit":
        row[1] = 1 << 40
    else:
        row[3] = "12.5"
    sink = RowSink(table, 100)
    c, py, built = _tuple_batches(sink, [tuple(row)], cpack, monkeypatch)
    assert not built
    if isinstance(py, type):  # the Python path cannot convert it either (an int32 that does not fit)
        assert c is py
    else:
        assert c.to_pylist() == py.to_pylist()


def test_text_that_is_not_utf8_takes_the_numpy_path(cpack: Any, tmp_path: Any) -> None:
    """A lone surrogate cannot be UTF-8: the C packer gives up and the numpy path decides (it
    cannot either: the rows are dropped with one line, as before the C packer)."""
    interner = Interner()
    sink = PackedSink(TABLES["requests"], 100, interner)
    sink.append(("bad\udc80", 1, 2, "ok", None, 3))
    assert sink._c_batch(sink.buf[:]) is None
    with pytest.raises(UnicodeEncodeError):
        sink._drain_rows()


def test_a_struct_not_imported_is_released_once(cpack: Any) -> None:
    interner = Interner()
    sink = PackedSink(TABLES["spans"], 100, interner)
    sink.append(("r", "decode", 1, 2, "server"))
    out = ctypes.create_string_buffer(80)
    address = ctypes.addressof(out)
    assert cpack.pack(sink.buf[:], sink.ncols, sink._kinds, interner._strings, address) == 1
    cpack.release(address)
    cpack.release(address)  # released: its release callback is now NULL, nothing happens
    with pytest.raises(ValueError):
        cpack.pack(sink.buf[:-1], sink.ncols, sink._kinds, interner._strings, address)
    with pytest.raises(ValueError):
        cpack.pack(sink.buf[:], sink.ncols, b"x" * sink.ncols, interner._strings, address)


def test_imported_batches_free_their_memory(cpack: Any) -> None:
    """600-row batches built and dropped 5,000 times (~1.7 GB if each leaked) leave RSS flat."""
    interner = Interner()
    sink = PackedSink(TABLES["tokens"], 10_000, interner)
    for i in range(600):
        sink.append((f"r{i % 7}", i, i, i, None, 5, 1, i, None))
    chunk = sink.buf[:]

    def rss_mib() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    for _ in range(200):
        sink._c_batch(chunk)
    before = rss_mib()
    for _ in range(5_000):
        b = sink._c_batch(chunk)
        assert b is not None and b.num_rows == 600
    assert rss_mib() - before < 64


@pytest.mark.parametrize("name", sorted(TABLES))
def test_an_uncompressed_message_is_what_a_stream_writer_writes(name: str) -> None:
    """The writer writes small batches with RecordBatch.serialize(): the bytes must be the stream
    writer's, or the trace files would change with it."""
    schema = TABLES[name].arrow_schema
    batch = pa.RecordBatch.from_pylist([], schema=schema)
    if name in PACKED:
        sink = PackedSink(TABLES[name], 100, Interner())
        sink.append([None if c.kind == "string" else 7 for c in TABLES[name].columns])
        batch = sink._drain_rows()
    out = pa.BufferOutputStream()
    with pa.ipc.new_stream(out, schema, options=pa.ipc.IpcWriteOptions(compression=None)) as w:
        w.write_batch(batch)
    stream = out.getvalue().to_pybytes()
    head = schema.serialize().to_pybytes()
    assert stream == head + batch.serialize().to_pybytes() + b"\xff\xff\xff\xff\x00\x00\x00\x00"
