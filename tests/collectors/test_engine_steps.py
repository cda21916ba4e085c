"""Continuous batching through the explicit API: steps rows, tokens tied by step_id, and the
analyzer-style question "whose prefill stretched this request's inter-token latency?"."""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow.compute as pc

MS = 1_000_000


def run_engine(rec: Any) -> None:
    """Replay an engine's log: request A decodes alone every 10 ms; at step 4 request B arrives
    with a 512-token prompt and its prefill shares A's iteration, which takes 60 ms."""
    a = rec.request("A", prompt_tokens=100)
    b = rec.request("B", prompt_tokens=512)
    t = 1_000 * MS
    a_index, b_index = 0, 0
    for step_id in range(1, 9):
        b_in = step_id >= 4
        prefill_b = step_id == 4
        dur = 60 * MS if prefill_b else (12 * MS if b_in else 10 * MS)
        start, end = t, t + dur
        batch = 2 if b_in else 1
        rec.step(step_id, start, end, batch_size=batch,
                 prefill_tokens=(512 if prefill_b else 0) + (100 if step_id == 1 else 0),
                 decode_tokens=(0 if step_id == 1 else 1) + (1 if b_in and not prefill_b else 0),
                 kv_tokens=(100 + a_index + 1) + ((512 + b_index) if b_in else 0))
        a.token(a_index, kv_len=100 + a_index, emit_ns=end + 100_000, step_start_ns=start, step_end_ns=end,
                batch_size=batch, step_id=step_id)
        a_index += 1
        if b_in:
            b.token(b_index, kv_len=512 + b_index, emit_ns=end + 100_000, step_start_ns=start,
                    step_end_ns=end, batch_size=batch, step_id=step_id)
            b_index += 1
        t = end + MS
    a.output_tokens, b.output_tokens = a_index, b_index
    a.finish()
    b.finish()


QUERY = """
WITH itl AS (
    SELECT request_id, index, step_id,
           emit_ns - lag(emit_ns) OVER (PARTITION BY request_id ORDER BY index) AS itl_ns
    FROM tokens
),
worst AS (
    SELECT * FROM itl WHERE request_id = 'A' AND itl_ns IS NOT NULL ORDER BY itl_ns DESC LIMIT 1
)
SELECT w.index, w.itl_ns, s.prefill_tokens, s.batch_size,
       list(DISTINCT o.request_id) FILTER (WHERE o.request_id <> 'A' AND o.index = 0) AS prefilled_with
FROM worst w
JOIN steps s USING (step_id)
LEFT JOIN tokens o ON o.step_id = w.step_id
GROUP BY ALL
"""


def test_one_requests_itl_is_stretched_by_anothers_prefill(recorder: Any, read: Any) -> None:
    rec = recorder()
    run_engine(rec)
    t = read(rec)
    con = duckdb.connect()
    t.register(con)
    index, itl_ns, prefill_tokens, batch, prefilled_with = con.execute(QUERY).fetchone()
    assert index == 3
    assert itl_ns == 61 * MS  # 60 ms step + 1 ms gap, against 11 ms for the others
    assert prefill_tokens == 512 and batch == 2
    assert prefilled_with == ["B"]


def test_every_token_row_points_at_a_recorded_step(recorder: Any, read: Any) -> None:
    rec = recorder()
    run_engine(rec)
    t = read(rec)
    step_ids = set(t.table("steps").column("step_id").to_pylist())
    tokens = t.table("tokens")
    assert set(tokens.column("step_id").to_pylist()) <= step_ids
    # tokens of one step share that step's times (a plain pyarrow check, no DuckDB)
    steps = {r["step_id"]: r for r in t.table("steps").to_pylist()}
    for r in tokens.to_pylist():
        s = steps[r["step_id"]]
        assert (r["step_start_ns"], r["step_end_ns"], r["batch_size"]) == (s["start_ns"], s["end_ns"],
                                                                            s["batch_size"])
    assert pc.sum(t.table("steps").column("prefill_tokens")).as_py() == 612
    reqs = {r["request_id"]: r for r in t.table("requests").to_pylist()}
    assert (reqs["A"]["output_tokens"], reqs["B"]["output_tokens"]) == (8, 5)
