-- Module gpu: GPU samples (the `gpu` table, NVML) during decode.
--
-- A decode window is a request's first-to-last token (server clock); windows of
-- a trace are merged, and each sample is in decode when it falls inside one.
-- NVML's utilization.gpu is "a kernel ran during the sample period", not how
-- busy the SMs were; GPM SM and DRAM metrics (Hopper+) say more. When samples are
-- further apart than a decode step, a sample averages several steps.

-- @view gpu_windows
-- Merged decode windows per trace (server clock).
-- @column trace: Trace label.
-- @column start_ns: Window start, nanoseconds (server clock).
-- @column end_ns: Window end, nanoseconds (server clock).
CREATE OR REPLACE VIEW gpu_windows AS
WITH w AS (
    SELECT trace, first_emit_ns AS s, last_emit_ns AS e
    FROM tokens_requests WHERE first_emit_ns IS NOT NULL AND last_emit_ns > first_emit_ns
),
m AS (
    SELECT *, max(e) OVER (PARTITION BY trace ORDER BY s, e
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
    FROM w
),
isl AS (
    SELECT *, sum(CASE WHEN prev_end IS NULL OR s > prev_end THEN 1 ELSE 0 END)
                  OVER (PARTITION BY trace ORDER BY s, e) AS island
    FROM m
)
SELECT trace, min(s) AS start_ns, max(e) AS end_ns
FROM isl GROUP BY trace, island;

-- @table gpu_decode
-- One row per trace and GPU: sampling interval and utilisation inside and outside decode windows.
-- @column trace: Trace label.
-- @column gpu: GPU index as NVML numbers it.
-- @column samples: Samples of this GPU (count).
-- @column interval_ms: Median time between consecutive samples, milliseconds.
-- @column decode_samples: Samples inside a decode window (count).
-- @column sm_util_decode_pct: Mean SM activity during decode, percent.
-- @column gpu_util_decode_pct: Mean NVML utilization.gpu during decode, percent.
-- @column mem_util_decode_pct: Mean memory-controller busy during decode, percent.
-- @column dram_bw_util_decode_pct: Mean DRAM bandwidth used during decode, percent of peak (GPM).
-- @column tensor_util_decode_pct: Mean tensor-core activity during decode, percent (GPM).
-- @column power_decode_w: Mean power during decode, watts.
-- @column sm_util_idle_pct: Mean SM activity outside decode windows, percent.
CREATE OR REPLACE TEMP TABLE gpu_decode AS
WITH s AS (
    SELECT g.*, (g.ts_ns - lag(g.ts_ns) OVER (PARTITION BY g.trace, g.gpu ORDER BY g.ts_ns)) / 1e6 AS dt_ms
    FROM gpu AS g
),
j AS (
    SELECT s.*, w.end_ns IS NOT NULL AND s.ts_ns <= w.end_ns AS in_decode
    FROM s ASOF LEFT JOIN gpu_windows AS w ON s.trace = w.trace AND s.ts_ns >= w.start_ns
)
SELECT
    trace, gpu,
    count(*) AS samples,
    quantile_cont(dt_ms, 0.5) AS interval_ms,
    count(*) FILTER (WHERE in_decode) AS decode_samples,
    avg(sm_util_pct) FILTER (WHERE in_decode) AS sm_util_decode_pct,
    avg(gpu_util_pct) FILTER (WHERE in_decode) AS gpu_util_decode_pct,
    avg(mem_util_pct) FILTER (WHERE in_decode) AS mem_util_decode_pct,
    avg(dram_bw_util_pct) FILTER (WHERE in_decode) AS dram_bw_util_decode_pct,
    avg(tensor_util_pct) FILTER (WHERE in_decode) AS tensor_util_decode_pct,
    avg(power_w) FILTER (WHERE in_decode) AS power_decode_w,
    avg(sm_util_pct) FILTER (WHERE NOT in_decode) AS sm_util_idle_pct
FROM j
GROUP BY trace, gpu
ORDER BY trace, gpu;
