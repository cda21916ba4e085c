-- Module steps: batch effects seen from the engine's iterations (the `steps`
-- table of batched servers). Empty when the trace has no steps table.
--
-- In continuous batching one request's ITL is the step time of a batch it shares
-- with others, and a step that also prefills someone's prompt stretches every
-- decode in it (docs/domain.md §3: queueing and batching policy).

-- @table steps_batch
-- One row per batch size: how long steps of that size take.
-- @column batch_size: Sequences in the batch.
-- @column steps: Iterations with this batch size (count).
-- @column mean_step_ms: Mean iteration time, milliseconds.
-- @column p50_step_ms: Median iteration time, milliseconds.
-- @column mean_prefill_tokens: Mean prompt tokens processed per iteration, tokens.
-- @column mean_decode_tokens: Mean tokens decoded per iteration, tokens.
-- @column mean_kv_tokens: Mean KV-cache tokens attended per iteration (summed over the batch), tokens.
-- @column ms_per_decode_token: Iteration time divided by decode tokens, summed then divided, milliseconds.
CREATE OR REPLACE TEMP TABLE steps_batch AS
SELECT
    batch_size,
    count(*) AS steps,
    avg((end_ns - start_ns) / 1e6) AS mean_step_ms,
    quantile_cont((end_ns - start_ns) / 1e6, 0.5) AS p50_step_ms,
    avg(prefill_tokens) AS mean_prefill_tokens,
    avg(decode_tokens) AS mean_decode_tokens,
    avg(kv_tokens) AS mean_kv_tokens,
    sum((end_ns - start_ns) / 1e6) / nullif(sum(decode_tokens), 0) AS ms_per_decode_token
FROM steps
GROUP BY batch_size
ORDER BY batch_size;

-- @table steps_prefill
-- One row: iterations that also prefill against decode-only iterations.
-- @column steps: Iterations (count).
-- @column prefill_steps: Iterations with prefill_tokens > 0 (count).
-- @column decode_only_steps: Iterations with decode tokens and no prefill (count).
-- @column prefill_step_ms: Mean time of iterations that prefill, milliseconds.
-- @column decode_only_step_ms: Mean time of decode-only iterations, milliseconds.
-- @column stall_ratio: prefill_step_ms / decode_only_step_ms.
-- @column stalled_decode_share: Share of decode tokens produced in iterations that also prefill, 0..1.
CREATE OR REPLACE TEMP TABLE steps_prefill AS
SELECT
    count(*) AS steps,
    count(*) FILTER (WHERE prefill_tokens > 0) AS prefill_steps,
    count(*) FILTER (WHERE prefill_tokens = 0 AND decode_tokens > 0) AS decode_only_steps,
    avg((end_ns - start_ns) / 1e6) FILTER (WHERE prefill_tokens > 0) AS prefill_step_ms,
    avg((end_ns - start_ns) / 1e6) FILTER (WHERE prefill_tokens = 0 AND decode_tokens > 0) AS decode_only_step_ms,
    avg((end_ns - start_ns) / 1e6) FILTER (WHERE prefill_tokens > 0)
        / nullif(avg((end_ns - start_ns) / 1e6) FILTER (WHERE prefill_tokens = 0 AND decode_tokens > 0), 0)
        AS stall_ratio,
    sum(decode_tokens) FILTER (WHERE prefill_tokens > 0) / nullif(sum(decode_tokens), 0) AS stalled_decode_share
FROM steps;
