"""What the timing function's raw tuples become on the writer's flusher thread: ``steps`` and
``tokens`` columns, vectorised, as Arrow arrays of the tables' own types.

The step path only appends tuples to lists (:meth:`tracetool.writer.sinks.Sink.tuple_feed`):
between forward passes the CPU caches are cold, and ``list.append`` is the cheapest hand-off a
Python hot path has there (packing a row with ``struct`` into an ``array`` cost about 3 µs more,
their C code being cold too). The conversion runs here, off the host's thread.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from tracetool.schema import INT_NULL
from tracetool.writer.sinks import int_array

#: A raw CPU step: (step_id, start_ns, end_ns, batch, q_len, kv_len, prefill).
STEP_FIELDS = 7
_I32, _I64 = pa.int32(), pa.int64()


def step_columns(raws: list[Any]) -> dict[str, Any]:
    """``steps`` columns of raw step tuples (CUDA steps arrive with their device times in place of
    the host's, :data:`~tracetool.schema.INT_NULL` where the events never resolved)."""
    sid, start, end, batch, q, kv, pre = _int_columns(raws, STEP_FIELDS)
    prefill = pre != 0
    return {"step_id": int_array(sid, _I64),
            "start_ns": _ns_array(start), "end_ns": _ns_array(end),
            "batch_size": int_array(batch, _I32),
            "prefill_tokens": int_array(np.where(prefill, batch * q, 0), _I32),
            "decode_tokens": int_array(np.where(prefill, 0, batch), _I32),
            "kv_tokens": int_array(batch * kv, _I64)}


#: A token tied to a CPU step (``HookHandle.token``): (request code, index, emit_ns, the raw step).
TOKEN_FIELDS = 4
_TOKEN_HEAD, _TOKEN_STEP = operator.itemgetter(0, 1, 2), operator.itemgetter(3)


def token_columns(rows: list[Any], strings: Callable[[np.ndarray, None], pa.Array]) -> dict[str, Any]:
    """``tokens`` columns of token tuples (:data:`TOKEN_FIELDS`): ``kv_len`` and the step columns
    are the step's; ``strings(codes, None)`` turns request codes into their ids (the sink's
    interner, :meth:`tracetool.writer.sinks.PackedSink.strings`). The step is the raw step tuple
    itself, not a copy of its fields: one small tuple on the token's path instead of two."""
    code, index, emit = _int_columns(list(map(_TOKEN_HEAD, rows)), 3)
    sid, start, end, batch, _q, kv, _pre = _int_columns(list(map(_TOKEN_STEP, rows)), STEP_FIELDS)
    return {"request_id": strings(code, None),
            "index": int_array(index, _I32), "emit_ns": int_array(emit, _I64),
            "kv_len": int_array(kv, _I32),
            "step_start_ns": int_array(start, _I64), "step_end_ns": int_array(end, _I64),
            "batch_size": int_array(batch, _I32),
            "step_id": int_array(sid, _I64)}


def _int_columns(rows: Any, width: int) -> np.ndarray:
    """Columns of equal-width int tuples (bools count as 0 and 1), one C pass over the values."""
    flat = np.fromiter(itertools.chain.from_iterable(rows), np.int64, len(rows) * width)
    return np.ascontiguousarray(flat.reshape(-1, width).T)


def _ns_array(v: np.ndarray) -> pa.Array:
    null = v == INT_NULL  # a CUDA step whose events never resolved
    return int_array(v, _I64, null if null.any() else None)
