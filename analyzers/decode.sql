-- Module decode: decode time against KV length, and per-request versus
-- aggregate tokens per second.
--
-- The fit is step time = base + slope x kv_len over decode tokens (index > 0),
-- least squares, from the moment sums of tokens_requests (step basis: the
-- forward pass's own time) or, when no step times were recorded, of
-- tokens_gap_stats (ITL basis: server-side gap). Decode streams the weights and
-- the whole KV cache every step, so on a GPU the slope is the KV cache's share of
-- memory traffic (docs/domain.md §1).
--
-- Batched traces (a steps table whose decode iterations run more than one
-- sequence) are fitted at step level instead (basis 'batch-step'): one decode-only
-- iteration's time = base + a x its summed kv_tokens + b x its batch size, least
-- squares over those iterations. A step reads the weights once and every
-- sequence's KV cache, so its time follows the batch's KV tokens, not one token's
-- own kv_len (which, in a batch, says little about what the step read).

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

-- Moment sums of decode-only iterations (no prefill) of every trace: x = summed
-- kv_tokens, z = batch size, y = step time in milliseconds.
CREATE OR REPLACE TEMP TABLE _decode_step_moments AS
WITH s AS (
    SELECT kv_tokens::DOUBLE AS x, batch_size::DOUBLE AS z, dur_ns / 1e6 AS y
    FROM _steps_seq
    WHERE prefill_tokens = 0 AND decode_tokens > 0 AND kv_tokens IS NOT NULL
)
SELECT count(*) AS n, max(z) AS z_max, sum(x) AS sx, sum(z) AS sz, sum(y) AS sy,
    sum(x * x) AS sxx, sum(z * z) AS szz, sum(x * z) AS sxz, sum(x * y) AS sxy, sum(z * y) AS szy,
    sum(y * y) AS syy, min(x)::BIGINT AS x_min, max(x)::BIGINT AS x_max
FROM s;

-- The two-regressor fit y = base + a x + b z from the centred moments. When batch size
-- barely varies, or moves with the KV tokens (squared correlation above 0.9: a batch
-- draining at steady context), the two cannot be told apart and noise would split the
-- time between them at random: then b is 0 and a is the plain slope on KV tokens.
CREATE OR REPLACE TEMP TABLE _decode_step_fit AS
WITH c AS (
    SELECT n, sy / n AS ym, sx / n AS xm, sz / n AS zm,
        sxx - sx * sx / n AS cxx, szz - sz * sz / n AS czz, sxz - sx * sz / n AS cxz,
        sxy - sx * sy / n AS cxy, szy - sz * sy / n AS czy, syy - sy * sy / n AS cyy, x_min, x_max
    FROM _decode_step_moments
    WHERE n >= 3
),
d AS (
    SELECT *, cxx * czz - cxz * cxz AS det,
        cxx > 1e-9 * greatest(cxx + xm * xm * n, 1e-300) AS x_ok,
        czz > 1e-9 * greatest(czz + zm * zm * n, 1e-300) AS z_ok
    FROM c
),
f AS (
    SELECT *,
        CASE WHEN two THEN (czz * cxy - cxz * czy) / det WHEN x_ok THEN cxy / cxx END AS a,
        CASE WHEN two THEN (cxx * czy - cxz * cxy) / det WHEN x_ok THEN 0.0 END AS b
    FROM (SELECT *, x_ok AND z_ok AND det > 0.1 * cxx * czz AS two FROM d)
)
SELECT n, ym AS mean_ms, a, b, ym - a * xm - b * zm AS base,
    CASE WHEN a IS NOT NULL AND cyy > 1e-12 * greatest(cyy + ym * ym * n, 1e-300)
         THEN least(1.0, greatest(0.0, (a * cxy + b * czy) / cyy)) END AS r2,
    x_min, x_max
FROM f;

-- @table decode_fit
-- The decode fit over all decode tokens of successful requests (level 'all', one
-- row) and, when step times were recorded, per request (level 'request', basis 'step').
-- The 'all' row's basis is 'batch-step' for batched traces (see the module comment),
-- else 'step' when step times were recorded, else 'itl'; per-request ITL-basis fits
-- need tokens in order and are computed on demand by the view decode_itl_fit.
-- Fits need 3 tokens (or iterations) and a spread of kv_len; otherwise base, slope and r2 are null.
-- @column level: 'all' or 'request'.
-- @column trace: Trace label (null on the 'all' row).
-- @column request_id: Request id (null on the 'all' row).
-- @column basis: 'batch-step' (decode-only iteration time against its summed kv_tokens and batch size), 'step' (a token's forward-pass time against its kv_len) or 'itl' (server-side gap per emission against kv_len).
-- @column n: Tokens in the fit (count; iterations on the batch-step basis).
-- @column base_ms: Intercept: time at kv_len 0 (batch-step: at 0 KV tokens and batch 0), milliseconds.
-- @column per_1k_kv_ms: Slope: added time per 1,000 tokens of kv_len (batch-step: of the step's summed KV tokens), milliseconds.
-- @column per_seq_ms: Batch-step basis only: added time per sequence in the batch at equal KV tokens, milliseconds (0 when batch size and KV tokens cannot be told apart); null on other bases.
-- @column r2: Coefficient of determination, 0..1.
-- @column mean_ms: Mean of the fitted time (step or ITL), milliseconds.
-- @column kv_len_min: Smallest kv_len among decode tokens (batch-step: smallest summed kv_tokens of an iteration), tokens.
-- @column kv_len_max: Largest kv_len among decode tokens (batch-step: largest summed kv_tokens), tokens.
CREATE OR REPLACE TEMP TABLE decode_fit AS
WITH ok AS (SELECT * FROM tokens_requests WHERE NOT failed),
basis AS (
    SELECT CASE WHEN (SELECT n >= 3 AND z_max > 1 FROM _decode_step_moments) THEN 'batch-step'
                WHEN coalesce(sum(fit_n), 0) >= 3 THEN 'step' ELSE 'itl' END AS b FROM ok
),
token_basis AS (
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
    FROM token_basis, tokens_gap_stats AS g
    UNION ALL
    SELECT 'request', trace, request_id, kv_len_min, kv_len_max, fit_n, fit_sx, fit_sxx, fit_sy, fit_syy, fit_sxy
    FROM tokens_requests, token_basis
    WHERE b = 'step'
),
tok AS (
    SELECT level, trace, request_id,
        CASE WHEN level = 'all' THEN (SELECT b FROM token_basis) ELSE 'step' END AS basis, coalesce(n, 0)::BIGINT AS n,
        _fit_base(n, sx, sxx, sy, sxy) AS base_ms,
        _fit_slope(n, sx, sxx, sy, sxy) * 1000 AS per_1k_kv_ms,
        NULL::DOUBLE AS per_seq_ms,
        _fit_r2(n, sx, sxx, sy, syy, sxy) AS r2,
        CASE WHEN n > 0 THEN sy / n END AS mean_ms,
        kv_len_min::BIGINT AS kv_len_min, kv_len_max::BIGINT AS kv_len_max
    FROM m
)
SELECT * FROM tok WHERE level = 'request' OR (SELECT b FROM basis) <> 'batch-step'
UNION ALL
SELECT 'all', NULL, NULL, 'batch-step', n::BIGINT, base, a * 1000, b, r2, mean_ms, x_min, x_max
FROM _decode_step_fit
WHERE (SELECT b FROM basis) = 'batch-step'
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
-- @column mean_concurrency: Successful requests in flight on average (sum of their durations / wall time, summed over traces).
CREATE OR REPLACE TEMP TABLE decode_throughput AS
WITH per_trace AS (
    SELECT r.trace,
        (max(r.end_ns) - min(r.start_ns)) / 1e9 AS wall_s,
        sum(r.end_ns - r.start_ns) FILTER (WHERE r.ok) / 1e9 AS busy_s,
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
