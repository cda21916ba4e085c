-- Module host: time the host spends between forward passes.
--
-- For a decode token with step times, host_ms = server-side ITL - step time: the
-- part of each token spent outside the model (scheduling, sampling, detokenize,
-- Python). On small models and on CPU it is comparable to the step itself
-- (docs/domain.md §3). With a steps table, the gaps between consecutive engine
-- iterations give the same story from the engine's side.

-- @table host_overhead
-- One row: host time per token and between engine steps (null where the trace cannot say).
-- @column tokens: Decode tokens with both a server-side gap and a step time (count).
-- @column itl_mean_ms: Mean server-side ITL of those tokens, milliseconds.
-- @column step_mean_ms: Mean step time of those tokens, milliseconds.
-- @column host_mean_ms: Mean ITL minus step time, milliseconds.
-- @column host_share: host_mean_ms / itl_mean_ms, 0..1.
-- @column steps: Engine iterations in the steps table (count).
-- @column step_gap_mean_ms: Mean gap between the end of one step and the start of the next, per trace, milliseconds.
-- @column step_gap_p50_ms: Median of those gaps, milliseconds.
CREATE OR REPLACE TEMP TABLE host_overhead AS
WITH t AS (
    SELECT any_value(host_gaps) AS n, any_value(host_sum_ms) AS host, any_value(host_step_sum_ms) AS step
    FROM tokens_gap_stats
),
g AS (
    SELECT (start_ns - lag(end_ns) OVER (PARTITION BY trace ORDER BY start_ns, step_id)) / 1e6 AS gap_ms
    FROM steps
)
SELECT
    coalesce(n, 0)::BIGINT AS tokens,
    CASE WHEN n > 0 THEN (host + step) / n END AS itl_mean_ms,
    CASE WHEN n > 0 THEN step / n END AS step_mean_ms,
    CASE WHEN n > 0 THEN host / n END AS host_mean_ms,
    CASE WHEN n > 0 THEN host / nullif(host + step, 0) END AS host_share,
    (SELECT count(*) FROM steps)::BIGINT AS steps,
    (SELECT avg(gap_ms) FROM g) AS step_gap_mean_ms,
    (SELECT quantile_cont(gap_ms, 0.5) FROM g) AS step_gap_p50_ms
FROM t;
