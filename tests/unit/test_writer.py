"""The writer's one conversion path against pyarrow itself: the record batch a packed sink builds
from its int64 buffer is the one pyarrow builds from the same values as Python objects (nulls,
int32 values that do not fit, codes the interner forgot, any text); row tuples keep what converts;
and an uncompressed message is byte for byte what an Arrow stream writer writes."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracetool.schema import INT_NULL, TABLES
from tracetool.writer import Interner, PackedSink, RowSink

PACKED = sorted(name for name, t in TABLES.items() if all(c.kind != "float" for c in t.columns))
TEXTS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


def _expected(table: Any, rows: list[tuple[int, ...]], interner: Interner) -> pa.RecordBatch:
    """What the packed rows mean, built by pyarrow from Python values, column by column."""
    arrays = []
    for j, col in enumerate(table.columns):
        values: list[Any] = []
        for r in rows:
            v = r[j]
            if v == INT_NULL:
                values.append(None)
            elif col.kind == "string":
                values.append(interner.lookup([v])[0])
            else:
                lo, hi = -(1 << (col.type.bit_width - 1)), (1 << (col.type.bit_width - 1)) - 1
                values.append(v if lo <= v <= hi else None)  # out of range: null, never wrapped
        arrays.append(pa.array(values, col.type))
    return pa.RecordBatch.from_arrays(arrays, schema=table.arrow_schema)


@given(data=st.data())
@settings(max_examples=60, deadline=None)
@pytest.mark.parametrize("name", PACKED)
def test_a_packed_sink_builds_what_pyarrow_builds_from_the_values(name: str, data: Any) -> None:
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
    got = sink.drain()
    assert len(got) == 1 and sink.pending() == 0
    batch = got[0]
    batch.validate(full=True)
    want = _expected(table, rows, interner)
    assert batch.equals(want), (batch.to_pylist(), want.to_pylist())
    assert [a.null_count for a in batch.columns] == [a.null_count for a in want.columns]


@pytest.mark.parametrize("runs", [1, 20, 100, 600])
@pytest.mark.parametrize("name", ["tokens", "spans"])
def test_a_large_flush_builds_what_pyarrow_builds_from_the_values(name: str, runs: int) -> None:
    """Past SMALL_STRING_ROWS the string columns take the other lookups (distinct codes only, or
    one per run of equal codes, as a request's tokens come): the batch is still the one pyarrow
    builds from the values, also where a run's code is null or forgotten."""
    import random

    from tracetool.writer.sinks import SMALL_STRING_ROWS

    rng = random.Random(runs)
    table = TABLES[name]
    interner = Interner()
    codes = [interner.code(f"req-{i}" * (i % 3 + 1)) for i in range(40)]
    forgotten = interner.code("forgotten")
    interner.retire(forgotten)
    interner.collect()
    interner.collect()
    strs = [*codes, forgotten, INT_NULL]
    ints = [INT_NULL, 0, 7, -(1 << 31) - 1, 1 << 40, 123_456_789]
    n = SMALL_STRING_ROWS * 4
    # each run's string code; at 100 runs some are null or forgotten (then the distinct-code lookup)
    same = [rng.choice(strs if runs == 100 else codes) for _ in range(runs)]
    rows = [tuple(same[i * runs // n] if c.kind == "string" and runs else rng.choice(ints)
                  for c in table.columns) for i in range(n)]
    if runs == 600:  # changes too often for runs: the distinct-code lookup, nulls and forgotten codes too
        rows = [tuple(rng.choice(strs) if c.kind == "string" else v for c, v in zip(table.columns, r, strict=True))
                for r in rows]
    sink = PackedSink(table, 100_000, interner)
    for r in rows:
        sink.buf.frombytes(sink.pack(*r))
    (batch,) = sink.drain()
    batch.validate(full=True)
    assert batch.equals(_expected(table, rows, interner))


def test_a_row_tuple_value_of_the_wrong_type_is_converted_or_nulled_not_the_batch_lost() -> None:
    table = TABLES["gpu"]
    width = len(table.columns)
    good = (1_000, 0, 55.5) + (None,) * (width - 3)
    odd = (2_000, 1, "12.5", "not a number") + (None,) * (width - 4)
    sink = RowSink(table, 100)
    sink.append(good)
    sink.append(odd)
    (batch,) = sink.drain()
    rows = batch.to_pylist()
    names = [c.name for c in table.columns]
    assert [r[names[0]] for r in rows] == [1_000, 2_000]
    assert [r[names[2]] for r in rows] == [55.5, 12.5]  # a numeric string converts
    assert rows[1][names[3]] is None  # what cannot convert is null; the row stays


@pytest.mark.parametrize("name", sorted(TABLES))
def test_an_uncompressed_message_is_what_a_stream_writer_writes(name: str) -> None:
    """The writer writes small batches with RecordBatch.serialize(): the bytes must be the stream
    writer's, or the trace files would change with it."""
    schema = TABLES[name].arrow_schema
    batch = pa.RecordBatch.from_pylist([], schema=schema)
    if name in PACKED:
        sink = PackedSink(TABLES[name], 100, Interner())
        sink.append([None if c.kind == "string" else 7 for c in TABLES[name].columns])
        (batch,) = sink.drain()
    out = pa.BufferOutputStream()
    with pa.ipc.new_stream(out, schema, options=pa.ipc.IpcWriteOptions(compression=None)) as w:
        w.write_batch(batch)
    stream = out.getvalue().to_pybytes()
    head = schema.serialize().to_pybytes()
    assert stream == head + batch.serialize().to_pybytes() + b"\xff\xff\xff\xff\x00\x00\x00\x00"
