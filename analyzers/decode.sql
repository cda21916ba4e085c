-- Module decode: decode time against KV length, and per-request versus
-- aggregate tokens per second.
--
-- The fit is step time = base + slope x kv_len over decode tokens (index > 0),
-- least squares, from the moment sums of tokens_requests (step basis: the
-- forward pass's own time) or, when no step times were recorded, of
-- tokens_gap_stats (ITL basis: server-side gap). Decode streams the weights and
-- the whole KV cache every step, so on a GPU the slope is the KV cache's share of
-- memory traffic (docs/domain.md §1).

CREATE OR REPLACE MACRO _fit_sxx(n, sx, sxx) AS sxx - sx * sx / n;
CREATE OR REPLACE MACRO _fit_syy(n, sy, syy) AS syy - sy * sy / n;
CREATE OR REPLACE MACRO _fit_sxy(n, sx, sy, sxy) AS sxy - sx * sy / n;
CREATE OR REPLACE MACRO _fit_ok(n, sx, sxx) AS
    n >= 3 AND _fit_sxx(n, sx, sxx) > 1e-9 * greatest(sxx, 1e-300);
CREATE OR REPLACE MACRO _fit_slope(n, sx, sxx, sy, sxy) AS
    CASE WHEN _fit_ok(n, sx, sxx) THEN _fit_sxy(n, sx, sy, sxy) / _fit_sxx(n, sx, sxx) END;
CREATE OR REPLACE MACRO _fit_base(n, sx, sxx, sy, sxy) AS
    CASE WHEN _fit_ok(n, sx, sxx) THEN (sy - _fit_slope(n, sx, sxx, sy, sxy) * sx) / n END;
CREATE OR REPLACE MACRO _fit_r2(n, sx, sxx, sy, syy, sxy) AS
    CASE WHEN _fit_ok(n, sx, sxx) AND _fit_syy(n, sy, syy) > 1e-12 * greatest(syy, 1e-300)
         THEN least(1.0, greatest(0.0, _fit_sxy(n, sx, sy, sxy) * _fit_sxy(n, sx, sy, sxy)
              / (_fit_sxx(n, sx, sxx) * _fit_syy(n, sy, syy)))) END;

-- @table decode_fit
-- The decode fit over all decode tokens of successful requests (level 'all', one
-- row) and, on the step basis, per request (level 'request'). The basis is
-- 'step' when step times were recorded, else 'itl'; per-request ITL-basis fits
-- need tokens in order and are computed on demand by the view decode_itl_fit.
-- Fits need 3 tokens and a spread of kv_len; otherwise base, slope and r2 are null.
-- @column level: 'all' or 'request'.
-- @column trace: Trace label (null on the 'all' row).
-- @column request_id: Request id (null on the 'all' row).
-- @column basis: 'step' (forward-pass time) or 'itl' (server-side inter-token gap).
-- @column n: Tokens in the fit (count).
-- @column base_ms: Intercept: time at kv_len 0, milliseconds.
-- @column per_1k_kv_ms: Slope: added time per 1,000 tokens of kv_len, milliseconds.
-- @column r2: Coefficient of determination, 0..1.
-- @column mean_ms: Mean of the fitted time (step or ITL), milliseconds.
-- @column kv_len_min: Smallest kv_len among decode tokens, tokens.
-- @column kv_len_max: Largest kv_len among decode tokens, tokens.
CREATE OR REPLACE TEMP TABLE decode_fit AS
WITH ok AS (SELECT * FROM tokens_requests WHERE NOT failed),
basis AS (
    SELECT CASE WHEN coalesce(sum(fit_n), 0) >= 3 THEN 'step' ELSE 'itl' END AS b FROM ok
),
m AS (
    SELECT 'all' AS level, NULL::VARCHAR AS trace, NULL::VARCHAR AS request_id,
        (SELECT min(kv_len_min) FROM ok) AS kv_len_min, (SELECT max(kv_len_max) FROM ok) AS kv_len_max,
        CASE WHEN b = 'step' THEN (SELECT coalesce(sum(fit_n), 0) FROM ok) ELSE g.itl_fit_n END AS n,
        CASE WHEN b = 'step' THEN (SELECT sum(fit_sx) FROM ok) ELSE g.itl_fit_sx END AS sx,
        CASE WHEN b = 'step' THEN (SELECT sum(fit_sxx) FROM ok) ELSE g.itl_fit_sxx END AS sxx,
        CASE WHEN b = 'step' THEN (SELECT sum(fit_sy) FROM ok) ELSE g.itl_fit_sy END AS sy,
        CASE WHEN b = 'step' THEN (SELECT sum(fit_syy) FROM ok) ELSE g.itl_fit_syy END AS syy,
        CASE WHEN b = 'step' THEN (SELECT sum(fit_sxy) FROM ok) ELSE g.itl_fit_sxy END AS sxy
    FROM basis, tokens_gap_stats AS g
    UNION ALL
    SELECT 'request', trace, request_id, kv_len_min, kv_len_max, fit_n, fit_sx, fit_sxx, fit_sy, fit_syy, fit_sxy
    FROM tokens_requests, basis
    WHERE b = 'step'
)
SELECT level, trace, request_id, (SELECT b FROM basis) AS basis, coalesce(n, 0)::BIGINT AS n,
    _fit_base(n, sx, sxx, sy, sxy) AS base_ms,
    _fit_slope(n, sx, sxx, sy, sxy) * 1000 AS per_1k_kv_ms,
    _fit_r2(n, sx, sxx, sy, syy, sxy) AS r2,
    CASE WHEN n > 0 THEN sy / n END AS mean_ms,
    kv_len_min::BIGINT AS kv_len_min, kv_len_max::BIGINT AS kv_len_max
FROM m
ORDER BY level, trace, request_id;

-- @view decode_itl_fit
-- Per-request fit of server-side ITL against kv_len, computed on demand (reads
-- tokens in order; for one request filter on request_key).
-- @column trace: Trace label.
-- @column request_id: Request id.
-- @column request_key: Integer key of the request.
-- @column n: Tokens in the fit (count).
-- @column base_ms: Intercept: ITL at kv_len 0, milliseconds.
-- @column per_1k_kv_ms: Slope: added ITL per 1,000 tokens of kv_len, milliseconds.
-- @column r2: Coefficient of determination, 0..1.
CREATE OR REPLACE VIEW decode_itl_fit AS
WITH g AS (
    SELECT trace, request_id, request_key, count(kv_len) AS n, sum(kv_len::DOUBLE) AS sx, sum(kv_len::DOUBLE * kv_len) AS sxx,
        sum(CASE WHEN kv_len IS NOT NULL THEN server_itl_ms END) AS sy,
        sum(CASE WHEN kv_len IS NOT NULL THEN server_itl_ms * server_itl_ms END) AS syy,
        sum(kv_len * server_itl_ms) AS sxy
    FROM tokens_gaps GROUP BY trace, request_id, request_key
)
SELECT trace, request_id, request_key, n, _fit_base(n, sx, sxx, sy, sxy) AS base_ms,
    _fit_slope(n, sx, sxx, sy, sxy) * 1000 AS per_1k_kv_ms, _fit_r2(n, sx, sxx, sy, syy, sxy) AS r2
FROM g;

-- @table decode_throughput
-- Per-request decode speed against the server's aggregate token rate (one row):
-- the two numbers people confuse (docs/domain.md §1, §3.3). With several traces the
-- aggregate is the sum of each trace's rate (one trace per server, serving at
-- once), and wall_s the longest trace.
-- @column traces: Traces in this analysis (count).
-- @column requests: Successful requests with a decode rate (2 or more tokens and a TTFT) (count).
-- @column output_tokens: Tokens generated in all traces, failed requests included (count).
-- @column per_request_tok_s: Mean over requests of each request's decode rate, tokens per second.
-- @column per_request_tok_s_p50: Median of the per-request decode rates, tokens per second.
-- @column decode_s_mean: Mean time per request from first to last token (e2e - TTFT), seconds.
-- @column aggregate_tok_s: All tokens divided by the trace's wall time, summed over traces, tokens per second.
-- @column wall_s: Server-clock time from the first to the last event of a trace, seconds (longest trace).
-- @column mean_concurrency: Requests in flight on average (sum of request durations / wall time, summed over traces).
CREATE OR REPLACE TEMP TABLE decode_throughput AS
WITH per_trace AS (
    SELECT r.trace,
        (max(r.end_ns) - min(r.start_ns)) / 1e9 AS wall_s,
        sum(r.end_ns - r.start_ns) / 1e9 AS busy_s,
        (SELECT coalesce(sum(t.output_tokens), 0) FROM tokens_requests AS t WHERE t.trace = r.trace) AS tokens
    FROM attribution_requests AS r
    GROUP BY r.trace
),
ok AS (SELECT * FROM attribution_requests WHERE ok AND decode_tok_s IS NOT NULL)
SELECT
    (SELECT count(*) FROM _traces) AS traces,
    (SELECT count(*) FROM ok) AS requests,
    (SELECT coalesce(sum(output_tokens), 0) FROM tokens_requests)::BIGINT AS output_tokens,
    (SELECT favg(decode_tok_s) FROM ok) AS per_request_tok_s,
    (SELECT quantile_cont(decode_tok_s, 0.5) FROM ok) AS per_request_tok_s_p50,
    (SELECT favg(tpot_ms * (output_tokens - 1)) / 1000 FROM ok) AS decode_s_mean,
    (SELECT sum(tokens / wall_s) FROM per_trace WHERE wall_s > 0 AND tokens > 0) AS aggregate_tok_s,
    (SELECT max(wall_s) FROM per_trace) AS wall_s,
    (SELECT sum(busy_s / wall_s) FROM per_trace WHERE wall_s > 0) AS mean_concurrency;
