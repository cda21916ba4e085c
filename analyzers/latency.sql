-- Module latency: percentiles of e2e, TTFT, ITL and TPOT over successful
-- requests, with the conventions of vLLM bench serve / AIPerf (docs/domain.md §5):
-- percentiles interpolate linearly between order statistics (numpy's default).
-- e2e, TTFT and TPOT are per request; ITL is per token (index 0 excluded).

-- @table latency_percentiles
-- One row per metric: e2e, ttft, itl, tpot.
-- @column metric: 'e2e', 'ttft', 'itl' or 'tpot'.
-- @column clock: 'client', 'server' or 'mixed': which side the values were measured on (null when n is 0).
-- @column n: Values the percentiles are over (requests, or tokens for itl).
-- @column mean_ms: Mean, milliseconds.
-- @column p50_ms: Median, milliseconds.
-- @column p90_ms: 90th percentile, milliseconds.
-- @column p95_ms: 95th percentile, milliseconds.
-- @column p99_ms: 99th percentile, milliseconds.
CREATE OR REPLACE TEMP TABLE latency_percentiles AS
WITH r AS (SELECT * FROM attribution_requests WHERE ok),
per AS (
    SELECT 1 AS o, 'e2e' AS metric,
        CASE WHEN count(*) FILTER (WHERE e2e_source = 'client') = count(e2e_ms) THEN 'client'
             WHEN count(*) FILTER (WHERE e2e_source = 'client') = 0 THEN 'server' ELSE 'mixed' END AS clock,
        count(e2e_ms) AS n, favg(e2e_ms) AS mean_ms,
        quantile_cont(e2e_ms, [0.5, 0.9, 0.95, 0.99]) AS q
    FROM r
    UNION ALL
    SELECT 2, 'ttft',
        CASE WHEN count(*) FILTER (WHERE ttft_source = 'client') = count(ttft_ms) THEN 'client'
             WHEN count(*) FILTER (WHERE ttft_source = 'client') = 0 THEN 'server' ELSE 'mixed' END,
        count(ttft_ms), favg(ttft_ms), quantile_cont(ttft_ms, [0.5, 0.9, 0.95, 0.99])
    FROM r
    UNION ALL
    SELECT 3, 'itl',
        CASE WHEN client_gaps = gaps THEN 'client' WHEN client_gaps = 0 THEN 'server' ELSE 'mixed' END,
        gaps, itl_mean_ms, [itl_p50_ms, itl_p90_ms, itl_p95_ms, itl_p99_ms]
    FROM tokens_gap_stats
    UNION ALL
    SELECT 4, 'tpot',
        CASE WHEN count(*) FILTER (WHERE ttft_source = 'client' AND tpot_ms IS NOT NULL) = count(tpot_ms)
             THEN 'client'
             WHEN count(*) FILTER (WHERE ttft_source = 'client' AND tpot_ms IS NOT NULL) = 0 THEN 'server'
             ELSE 'mixed' END,
        count(tpot_ms), favg(tpot_ms), quantile_cont(tpot_ms, [0.5, 0.9, 0.95, 0.99])
    FROM r
)
SELECT metric, CASE WHEN n > 0 THEN clock END AS clock, n, mean_ms, q[1] AS p50_ms, q[2] AS p90_ms, q[3] AS p95_ms, q[4] AS p99_ms
FROM per
ORDER BY o;
