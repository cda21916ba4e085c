-- Module tokens: per-request token facts and per-token gaps (ITL), the inputs of
-- every latency, decode-fit and roofline figure.
--
-- Inputs: the `tokens` view (all traces, with a `trace` column), the `requests` view.
-- ITL follows vLLM bench serve / AIPerf: the gap between successive tokens of one
-- request in index order; index 0 (produced by prefill) has no ITL. The client-side
-- gap (client_recv_ns) is used where both tokens carry one, else the server-side
-- gap (emit_ns). Ordering uses an integer request key: sorting 10M rows on string
-- keys is several times slower in DuckDB than on integers.

-- @table tokens_requests
-- One row per request that has token rows: counts, the first and last token, and
-- the order-free sums of its decode tokens (index > 0) that the step-time fit and
-- the roofline need. Nothing here depends on row order, so no sort is needed.
-- Moment sums (n, sx, sy, sxx, syy, sxy) give the least-squares fit exactly and
-- add up across requests.
-- @column trace: Trace label (the trace directory's name, made unique).
-- @column request_id: Request id.
-- @column request_key: Integer key of (trace, request_id), unique in this connection; used to order tokens fast.
-- @column output_tokens: Token rows of the request (count).
-- @column first_index: Smallest token index seen (0 unless rows were dropped).
-- @column last_index: Largest token index seen.
-- @column first_emit_ns: Server clock, nanoseconds: emit time of token index 0 (null without index 0).
-- @column last_emit_ns: Server clock, nanoseconds: emit time of the highest index.
-- @column first_recv_ns: Client clock, nanoseconds: client receive time of token index 0 (null when not recorded).
-- @column min_emit_ns: Server clock, nanoseconds: earliest emit time of any token.
-- @column max_emit_ns: Server clock, nanoseconds: latest emit time of any token.
-- @column client_tokens: Token rows that carry client_recv_ns (count).
-- @column itl_mean_ms: Mean inter-token latency, milliseconds, from the first and last token (gaps add up): client-side when every token has client_recv_ns, else server-side.
-- @column decode_tokens: Token rows after token 0: rows minus one when index 0 is present (count).
-- @column kv_len_min: Smallest kv_len of decode tokens, tokens.
-- @column kv_len_max: Largest kv_len of decode tokens, tokens.
-- @column batch_mean: Mean batch_size of decode tokens, sequences (null when not recorded).
-- @column fit_n: Decode tokens with both kv_len and a step time (count): the step-time fit and the roofline's step basis.
-- @column fit_sx: Sum of kv_len over those tokens, tokens.
-- @column fit_sxx: Sum of kv_len squared over those tokens, tokens squared.
-- @column fit_sy: Sum of step time over those tokens, milliseconds.
-- @column fit_syy: Sum of step time squared over those tokens, milliseconds squared.
-- @column fit_sxy: Sum of kv_len times step time over those tokens, token-milliseconds.
-- @column roof_kv_tokens: Sum over those tokens of batch_size (1 when null) times kv_len, tokens.
-- @column roof_itl_tokens: Decode tokens with kv_len (count): the roofline's ITL basis.
-- @column roof_itl_kv_tokens: Sum over those of batch_size (1 when null) times kv_len, tokens.
-- @column failed: True when the requests table says status 'error' for this request.
CREATE OR REPLACE TEMP TABLE tokens_requests AS
WITH d AS (
    SELECT
        trace, request_id, index, emit_ns, client_recv_ns,
        CASE WHEN index > 0 THEN (step_end_ns - step_start_ns) / 1e6 END AS step_ms,
        CASE WHEN index > 0 THEN kv_len::DOUBLE END AS kv,
        CASE WHEN index > 0 THEN batch_size END AS batch
    FROM tokens
    WHERE request_id <> ''
),
per AS (
    SELECT
        trace,
        request_id,
        count(*) AS output_tokens,
        min(index) AS first_index,
        max(index) AS last_index,
        arg_max(emit_ns, index) AS last_emit_ns,
        min(emit_ns) AS min_emit_ns,
        max(emit_ns) AS max_emit_ns,
        count(client_recv_ns) AS client_tokens,
        arg_min(emit_ns, index) AS _emit_lo,
        arg_min(client_recv_ns, index) AS _recv_lo,
        arg_max(client_recv_ns, index) AS _recv_hi,
        min(kv)::BIGINT AS kv_len_min,
        max(kv)::BIGINT AS kv_len_max,
        avg(batch) AS batch_mean,
        count(kv * step_ms) AS fit_n,
        sum(kv + 0 * step_ms) AS fit_sx,
        sum(kv * kv + 0 * step_ms) AS fit_sxx,
        sum(step_ms + 0 * kv) AS fit_sy,
        sum(step_ms * step_ms + 0 * kv) AS fit_syy,
        sum(kv * step_ms) AS fit_sxy,
        sum(coalesce(batch, 1) * kv + 0 * step_ms) AS roof_kv_tokens,
        count(kv) AS roof_itl_tokens,
        sum(coalesce(batch, 1) * kv) AS roof_itl_kv_tokens
    FROM d
    GROUP BY trace, request_id
)
SELECT
    trace, request_id,
    (row_number() OVER (ORDER BY trace, request_id))::BIGINT AS request_key,
    output_tokens, first_index, last_index,
    CASE WHEN first_index = 0 THEN _emit_lo END AS first_emit_ns, last_emit_ns,
    CASE WHEN first_index = 0 THEN _recv_lo END AS first_recv_ns,
    min_emit_ns, max_emit_ns, client_tokens,
    CASE WHEN output_tokens < 2 THEN NULL
         WHEN client_tokens = output_tokens THEN (_recv_hi - _recv_lo) / 1e6 / (output_tokens - 1)
         ELSE (last_emit_ns - _emit_lo) / 1e6 / (output_tokens - 1) END AS itl_mean_ms,
    output_tokens - (first_index = 0)::INTEGER AS decode_tokens, kv_len_min, kv_len_max, batch_mean,
    fit_n, coalesce(fit_sx, 0) AS fit_sx, coalesce(fit_sxx, 0) AS fit_sxx,
    coalesce(fit_sy, 0) AS fit_sy, coalesce(fit_syy, 0) AS fit_syy, coalesce(fit_sxy, 0) AS fit_sxy,
    coalesce(roof_kv_tokens, 0) AS roof_kv_tokens,
    roof_itl_tokens, coalesce(roof_itl_kv_tokens, 0) AS roof_itl_kv_tokens,
    f.request_id IS NOT NULL AS failed
FROM per
LEFT JOIN (SELECT DISTINCT trace, request_id FROM requests WHERE status = 'error') AS f
    USING (trace, request_id);

-- @view tokens_gaps
-- One row per token that has a predecessor in its request (index > 0): the
-- inter-token latency and, where step times exist, the host time between steps.
-- For one request filter on request_key: it is the sort's partition, so the
-- filter is applied before the sort (a filter on request_id scans every token).
-- @column trace: Trace label.
-- @column request_id: Request id.
-- @column request_key: Integer key of the request (see tokens_requests).
-- @column index: Token index within the output (>= 1).
-- @column kv_len: Context length the producing forward pass attended over, tokens.
-- @column batch_size: Sequences in the batch of that forward pass.
-- @column step_id: The steps row that produced the token, when recorded.
-- @column step_ms: Forward-pass time (step_end_ns - step_start_ns), milliseconds; null when not recorded.
-- @column server_itl_ms: Gap to the previous token on the server clock (emit_ns), milliseconds.
-- @column client_itl_ms: Gap to the previous token on the client clock (client_recv_ns), milliseconds; null unless both tokens carry it.
-- @column itl_ms: Inter-token latency, milliseconds: client_itl_ms where measured, else server_itl_ms.
-- @column itl_clock: Which clock itl_ms comes from: 'client' or 'server'.
-- @column host_ms: server_itl_ms - step_ms, not below 0, milliseconds, on the first token of an emission (null on the others): time outside this request's forward pass. With a steps table that includes other iterations; host_overhead separates them.
-- @column emission: True when the token opens a new emission (itl_ms > 0); tokens streamed together (one chunk, a speculative step's accepted tokens) share one gap.
-- @column failed: True when the request failed (requests.status = 'error').
CREATE OR REPLACE VIEW tokens_gaps AS
SELECT
    trace, request_id, request_key, index, kv_len, batch_size, step_id, step_ms,
    server_itl_ms, client_itl_ms,
    coalesce(client_itl_ms, server_itl_ms) AS itl_ms,
    CASE WHEN client_itl_ms IS NOT NULL THEN 'client' ELSE 'server' END AS itl_clock,
    CASE WHEN server_itl_ms > 0 AND step_ms IS NOT NULL THEN greatest(server_itl_ms - step_ms, 0) END AS host_ms,
    coalesce(client_itl_ms, server_itl_ms) > 0 AS emission,
    failed
FROM (
    SELECT
        trace, request_id, request_key, index, kv_len, batch_size, step_id,
        step_ns / 1e6 AS step_ms,
        (emit_ns - lag(emit_ns) OVER w) / 1e6 AS server_itl_ms,
        (client_recv_ns - lag(client_recv_ns) OVER w) / 1e6 AS client_itl_ms,
        failed
    FROM (
        -- Partitioning on the integer request_key, not on (trace, request_id): DuckDB sorts
        -- integers several times faster than strings. (One global sort on a combined
        -- (request_key, index) key costs the same time and ~40 % more memory.) One column
        -- for the step time: less to carry through the sort.
        SELECT t.trace, t.request_id, r.request_key, t.index, t.kv_len, t.batch_size, t.step_id,
            t.step_end_ns - t.step_start_ns AS step_ns, t.emit_ns, t.client_recv_ns, r.failed
        FROM tokens AS t
        JOIN tokens_requests AS r USING (trace, request_id)
    )
    WINDOW w AS (PARTITION BY request_key ORDER BY index)
)
WHERE index > 0 AND server_itl_ms IS NOT NULL;

-- @view tokens_request_itl
-- ITL percentiles per request, computed on demand (reads tokens in order; for one
-- request filter on request_key).
-- @column trace: Trace label.
-- @column request_id: Request id.
-- @column request_key: Integer key of the request.
-- @column gaps: Emissions with an ITL (count).
-- @column itl_mean_ms: Mean ITL per emission, milliseconds.
-- @column itl_p50_ms: Median ITL, milliseconds.
-- @column itl_p90_ms: 90th percentile ITL, milliseconds.
-- @column itl_p99_ms: 99th percentile ITL, milliseconds.
-- @column itl_max_ms: Largest ITL, milliseconds.
CREATE OR REPLACE VIEW tokens_request_itl AS
SELECT trace, request_id, request_key, count(*) AS gaps, avg(itl_ms) AS itl_mean_ms,
    quantile_cont(itl_ms, 0.5) AS itl_p50_ms, quantile_cont(itl_ms, 0.9) AS itl_p90_ms,
    quantile_cont(itl_ms, 0.99) AS itl_p99_ms, max(itl_ms) AS itl_max_ms
FROM tokens_gaps
WHERE emission
GROUP BY trace, request_id, request_key;

-- @table tokens_gap_stats
-- The statistics that need tokens in order (they use each token's gap to the
-- previous one), in one pass over tokens_gaps of successful requests: ITL
-- percentiles per emission (a chunk of tokens streamed together counts once, as
-- vLLM bench serve counts them; TPOT stays per token), host time between steps, and the moment sums that fit
-- server-side ITL against kv_len (the decode fit's basis when no step times
-- were recorded). One row.
-- @column gaps: Emissions with an ITL: tokens with a gap above 0 (count).
-- @column gap_tokens: Tokens after token 0 with a gap, zero gaps included (count).
-- @column client_gaps: Of the emissions, those whose ITL is client-side (count).
-- @column itl_mean_ms: Mean ITL per emission, milliseconds.
-- @column itl_p50_ms: Median ITL, milliseconds (linear interpolation, as numpy).
-- @column itl_p90_ms: 90th percentile ITL, milliseconds.
-- @column itl_p95_ms: 95th percentile ITL, milliseconds.
-- @column itl_p99_ms: 99th percentile ITL, milliseconds.
-- @column host_gaps: Emissions with both a server-side gap and a step time (count).
-- @column host_sum_ms: Sum of host_ms (server gap minus step time, not below 0) over those, milliseconds.
-- @column host_step_sum_ms: Sum of step time over those, milliseconds.
-- @column itl_fit_n: Emissions with kv_len (count): the ITL fit and the roofline's ITL basis.
-- @column itl_fit_sx: Sum of kv_len over those tokens, tokens.
-- @column itl_fit_sxx: Sum of kv_len squared, tokens squared.
-- @column itl_fit_sy: Sum of server-side ITL, milliseconds.
-- @column itl_fit_syy: Sum of server-side ITL squared, milliseconds squared.
-- @column itl_fit_sxy: Sum of kv_len times server-side ITL, token-milliseconds.
CREATE OR REPLACE TEMP TABLE tokens_gap_stats AS
WITH s AS (
    SELECT
        count(*) FILTER (WHERE emission) AS gaps,
        count(*) AS gap_tokens,
        count(client_itl_ms) FILTER (WHERE emission) AS client_gaps,
        favg(itl_ms) FILTER (WHERE emission) AS itl_mean_ms,
        quantile_cont(itl_ms, [0.5, 0.9, 0.95, 0.99]) FILTER (WHERE emission) AS q,
        count(host_ms) AS host_gaps,
        sum(host_ms) AS host_sum_ms,
        sum(step_ms) FILTER (WHERE host_ms IS NOT NULL) AS host_step_sum_ms,
        count(kv_len) FILTER (WHERE server_itl_ms > 0) AS itl_fit_n,
        sum(kv_len::DOUBLE) FILTER (WHERE server_itl_ms > 0) AS itl_fit_sx,
        sum(kv_len::DOUBLE * kv_len) FILTER (WHERE server_itl_ms > 0) AS itl_fit_sxx,
        sum(CASE WHEN kv_len IS NOT NULL THEN server_itl_ms END) FILTER (WHERE server_itl_ms > 0) AS itl_fit_sy,
        sum(CASE WHEN kv_len IS NOT NULL THEN server_itl_ms * server_itl_ms END) FILTER (WHERE server_itl_ms > 0)
            AS itl_fit_syy,
        sum(kv_len * server_itl_ms) FILTER (WHERE server_itl_ms > 0) AS itl_fit_sxy
    FROM tokens_gaps
    WHERE NOT failed
)
SELECT
    gaps, gap_tokens, client_gaps, itl_mean_ms,
    q[1] AS itl_p50_ms, q[2] AS itl_p90_ms, q[3] AS itl_p95_ms, q[4] AS itl_p99_ms,
    host_gaps, coalesce(host_sum_ms, 0) AS host_sum_ms, coalesce(host_step_sum_ms, 0) AS host_step_sum_ms,
    itl_fit_n, coalesce(itl_fit_sx, 0) AS itl_fit_sx, coalesce(itl_fit_sxx, 0) AS itl_fit_sxx,
    coalesce(itl_fit_sy, 0) AS itl_fit_sy, coalesce(itl_fit_syy, 0) AS itl_fit_syy,
    coalesce(itl_fit_sxy, 0) AS itl_fit_sxy
FROM s;
