-- Module host: time the host spends between forward passes.
--
-- Host overhead is the engine's idle time between consecutive iterations and
-- between a step's end and its tokens' emit (scheduling, sampling, detokenize,
-- Python): the engine_gap part of the per-request step accounting
-- (steps_accounting). Time a request spends in iterations it is not part of
-- (other requests' prefill or decode steps) or preempted is scheduling, not host
-- overhead, and is left out. Without a steps table, a request's waits between its
-- own forward passes are all the host's (nothing else can be seen). Counted per
-- emission: tokens a speculative step accepts together share one gap. On small
-- models and on CPU the host time is comparable to the step itself (docs/domain.md §3).

-- @table host_overhead
-- One row: host time per emission and between engine steps (null where the trace cannot say).
-- @column tokens: Emissions of decode tokens (one forward pass's tokens for one request) with a gap and a step time (count).
-- @column itl_mean_ms: Mean server-side gap between a request's emissions, milliseconds.
-- @column step_mean_ms: Mean time of the request's own forward pass, milliseconds.
-- @column host_mean_ms: Mean engine gap (host time) per emission, milliseconds; never negative.
-- @column host_share: host_mean_ms / itl_mean_ms, 0..1.
-- @column waited_mean_ms: Mean time per emission in other iterations or preempted (scheduling, not host), milliseconds.
-- @column basis: How the own forward passes were found (see steps_accounting.basis).
-- @column steps: Engine iterations in the steps table (count).
-- @column step_gap_mean_ms: Mean gap between the end of one step and the start of the next, per trace, milliseconds.
-- @column step_gap_p50_ms: Median of those gaps, milliseconds.
CREATE OR REPLACE TEMP TABLE host_overhead AS
WITH a AS (
    SELECT emissions AS n, itl_ms AS itl, itl_ms * own_share AS own,
        itl_ms * engine_gap_share AS gap, basis
    FROM steps_accounting
),
g AS (SELECT gap_ns / 1e6 AS gap_ms FROM _steps_seq)
SELECT
    coalesce(n, 0)::BIGINT AS tokens,
    CASE WHEN n > 0 THEN itl / n END AS itl_mean_ms,
    CASE WHEN n > 0 THEN own / n END AS step_mean_ms,
    CASE WHEN n > 0 THEN gap / n END AS host_mean_ms,
    CASE WHEN n > 0 THEN gap / nullif(itl, 0) END AS host_share,
    CASE WHEN n > 0 THEN (itl - own - gap) / n END AS waited_mean_ms,
    basis,
    (SELECT count(*) FROM steps)::BIGINT AS steps,
    (SELECT avg(gap_ms) FROM g) AS step_gap_mean_ms,
    (SELECT quantile_cont(gap_ms, 0.5) FROM g) AS step_gap_p50_ms
FROM a;
