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
-- @column first_step_start_ns: Server clock, nanoseconds: start of the forward pass of its first decode token (null without step times).
-- @column last_step_start_ns: Server clock, nanoseconds: start of the forward pass of its last decode token.
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
        CASE WHEN index > 0 THEN batch_size END AS batch,
        CASE WHEN index > 0 THEN step_start_ns END AS step_start
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
        min(step_start) AS first_step_start_ns,
        max(step_start) AS last_step_start_ns,
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
    first_step_start_ns, last_step_start_ns,
    fit_n, coalesce(fit_sx, 0) AS fit_sx, coalesce(fit_sxx, 0) AS fit_sxx,
    coalesce(fit_sy, 0) AS fit_sy, coalesce(fit_syy, 0) AS fit_syy, coalesce(fit_sxy, 0) AS fit_sxy,
    coalesce(roof_kv_tokens, 0) AS roof_kv_tokens,
    roof_itl_tokens, coalesce(roof_itl_kv_tokens, 0) AS roof_itl_kv_tokens,
    f.request_id IS NOT NULL AS failed
FROM per
LEFT JOIN (SELECT DISTINCT trace, request_id FROM requests WHERE status = 'error') AS f
    USING (trace, request_id);

-- The keys of tokens_requests with the trace's position in the high bits, the form of
-- _steps_seq.id_key (trace position x 2^40 + step_id): joins on one integer.
CREATE OR REPLACE TEMP TABLE _tokens_requests_ti AS
SELECT r.trace, r.request_id, r.request_key, r.failed, x.ti * 1099511627776 AS _ti
FROM tokens_requests AS r
JOIN (SELECT trace, row_number() OVER (ORDER BY trace) AS ti FROM _traces) AS x USING (trace);

-- Steps of each trace (the steps table) in time order, with running sums that make "the
-- iterations between two of a request's forward passes" two lookups in the ordered pass
-- below instead of a range join (the per-request step accounting, steps.sql).
CREATE OR REPLACE TEMP TABLE _steps_seq AS
WITH x AS (
    -- per trace: its position, and its mean decode-only step (what a step that also prefilled is compared with)
    SELECT t.trace, t.ti, b.decode_only_ns
    FROM (SELECT trace, row_number() OVER (ORDER BY trace) AS ti FROM _traces) AS t
    LEFT JOIN (SELECT trace, avg(end_ns - start_ns) FILTER (WHERE prefill_tokens = 0 AND decode_tokens > 0)
                   AS decode_only_ns
               FROM steps GROUP BY trace) AS b USING (trace)
),
s AS (
    SELECT trace, step_id, start_ns, end_ns, prefill_tokens, decode_tokens, batch_size, kv_tokens, x.ti,
        end_ns - start_ns AS dur_ns, x.decode_only_ns,
        row_number() OVER w AS n,
        -- BIGINT, not the HUGEINT a sum of BIGINTs gives: 128-bit values double what a sort moves
        (sum(CASE WHEN prefill_tokens > 0 THEN end_ns - start_ns ELSE 0 END) OVER w)::BIGINT AS cum_prefill_ns,
        (sum(CASE WHEN prefill_tokens > 0 THEN 0 ELSE end_ns - start_ns END) OVER w)::BIGINT AS cum_other_ns,
        (sum(CASE WHEN decode_tokens > 0 THEN 1 ELSE 0 END) OVER w)::BIGINT AS cum_decode_steps,
        (sum(prefill_tokens) OVER w)::BIGINT AS cum_prefill_tokens,
        start_ns - lag(end_ns) OVER (PARTITION BY trace ORDER BY start_ns, step_id) AS gap_ns  -- no frame: Spark refuses one on lag
    FROM steps JOIN x USING (trace)
    WINDOW w AS (PARTITION BY trace ORDER BY start_ns, step_id ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT * EXCLUDE (ti, n),
    -- unique over every trace (the trace's position in the high bits): joins on one integer
    ti * 1099511627776 + n AS seq,
    ti * 1099511627776 + step_id AS id_key,
    CASE WHEN prefill_tokens > 0 THEN greatest(dur_ns - coalesce(decode_only_ns, dur_ns), 0) ELSE 0 END AS slowed_ns
FROM s;

-- Whether tokens without step_id are matched to steps rows by time (the ASOF branch of tokens_gaps),
-- decided once per analysis from what the traces contain: only when some trace has steps rows. Without
-- them (a third-party engine's first trace: step times, no step ids, no steps table) those tokens take
-- the step_id branch, whose lookup finds nothing, with the same result as an ASOF join that matches
-- nothing, and the ASOF join's sort of every such token on both sides is not run.
CREATE OR REPLACE TEMP TABLE _tokens_step_match AS
SELECT count(*) > 0 AS by_time FROM _steps_seq;

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
-- @column step_emission: True when the token opens a new forward pass for its request (its step differs from its predecessor's): one row of the step accounting (steps_emissions); the columns below are null on other rows.
-- @column step_match: How the forward pass was found: 0 step_id, 1 the steps row holding the token's step_start_ns, 2 the token's own step times (no steps row).
-- @column own_ms: The forward pass's time, milliseconds.
-- @column prefill_slowed_ms: Of own_ms, the part beyond the trace's mean decode-only step when the pass also prefilled, milliseconds.
-- @column between_prefill_ms: Time of the iterations with prefill work between the previous pass and this one, milliseconds.
-- @column between_other_ms: Time of the iterations without prefill between the previous pass and this one, milliseconds.
-- @column skipped_decode_steps: Decode iterations between the previous pass and this one (count; null without steps rows).
-- @column preempted: True when skipped_decode_steps is at least preemption_min_steps: the request was not running (preempted), so the whole wait is counted as such.
CREATE OR REPLACE VIEW tokens_gaps AS
SELECT
    g.trace, g.request_id, g.request_key, g.index, g.kv_len, g.batch_size, g.step_id, g.step_ms,
    g.server_itl_ms, g.client_itl_ms,
    coalesce(client_itl_ms, server_itl_ms) AS itl_ms,
    CASE WHEN client_itl_ms IS NOT NULL THEN 'client' ELSE 'server' END AS itl_clock,
    CASE WHEN server_itl_ms > 0 AND step_ms IS NOT NULL THEN greatest(server_itl_ms - step_ms, 0) END AS host_ms,
    coalesce(client_itl_ms, server_itl_ms) > 0 AS emission,
    g.failed,
    step_emission,
    -- a positive skey found by the ASOF join is one whose token has no step_id
    CASE WHEN step_emission THEN CASE WHEN g.skey < 0 THEN 2 WHEN g.step_id IS NULL THEN 1 ELSE 0 END END AS step_match,
    CASE WHEN step_emission THEN CASE WHEN g.skey > 0 THEN so.dur_ns ELSE g.step_ns END / 1e6 END AS own_ms,
    CASE WHEN step_emission THEN coalesce(so.slowed_ns, 0) / 1e6 END AS prefill_slowed_ms,
    -- the iterations strictly between the previous forward pass and this one: none when the two
    -- are consecutive steps (the common case, so the previous step is looked up only otherwise)
    CASE WHEN step_emission THEN CASE WHEN _adjacent THEN 0
        ELSE so.cum_prefill_ns - CASE WHEN so.prefill_tokens > 0 THEN so.dur_ns ELSE 0 END - sp.cum_prefill_ns
        END / 1e6 END AS between_prefill_ms,
    CASE WHEN step_emission THEN CASE WHEN _adjacent THEN 0
        ELSE so.cum_other_ns - CASE WHEN so.prefill_tokens > 0 THEN 0 ELSE so.dur_ns END - sp.cum_other_ns
        END / 1e6 END AS between_other_ms,
    CASE WHEN step_emission THEN CASE WHEN _adjacent THEN 0
        ELSE so.cum_decode_steps - CASE WHEN so.decode_tokens > 0 THEN 1 ELSE 0 END - sp.cum_decode_steps
        END END AS skipped_decode_steps,
    CASE WHEN step_emission THEN NOT _adjacent AND coalesce(so.cum_decode_steps - CASE WHEN so.decode_tokens > 0
        THEN 1 ELSE 0 END - sp.cum_decode_steps >= (SELECT preemption_min_steps FROM _thresholds), false)
        END AS preempted
FROM (
    SELECT *, skey IS NOT NULL AND skey IS DISTINCT FROM _p_skey AS step_emission,
        skey > 0 AND skey - _p_skey = 1 AS _adjacent
    FROM (
        SELECT
            trace, request_id, request_key, index, kv_len, batch_size, step_id, step_ns,
            step_ns / 1e6 AS step_ms,
            (emit_ns - lag(emit_ns) OVER w) / 1e6 AS server_itl_ms,
            (client_recv_ns - lag(client_recv_ns) OVER w) / 1e6 AS client_itl_ms,
            failed, skey, lag(skey) OVER w AS _p_skey
        FROM (
            -- Partitioning on the integer request_key, not on (trace, request_id): DuckDB sorts
            -- integers several times faster than strings. (One global sort on a combined
            -- (request_key, index) key costs the same time and ~40 % more memory.) One column
            -- for the step time: less to carry through the sort. skey: the token's forward pass,
            -- its seq in _steps_seq (positive), by step_id (one integer key), else (no step_id)
            -- the steps row whose start is the latest at or before the token's step_start_ns and
            -- whose end is not before it; without a steps row, minus the token's own step start.
            -- The ASOF join sorts both sides, so its steps side is empty unless it is needed. What
            -- the steps row says of the pass (its time, its prefill slowdown) is looked up after the
            -- sort, by skey: every column carried through it costs memory and time on every token.
            SELECT t.trace, t.request_id, r.request_key, t.index, t.kv_len, t.batch_size, t.step_id,
                t.step_end_ns - t.step_start_ns AS step_ns, t.emit_ns, t.client_recv_ns, r.failed,
                coalesce(s.seq, -1 - t.step_start_ns) AS skey
            FROM tokens AS t
            JOIN _tokens_requests_ti AS r USING (trace, request_id)
            LEFT JOIN _steps_seq AS s ON s.id_key = r._ti + t.step_id
            WHERE t.step_id IS NOT NULL OR t.step_start_ns IS NULL OR NOT (SELECT by_time FROM _tokens_step_match)
            UNION ALL
            SELECT t.trace, t.request_id, r.request_key, t.index, t.kv_len, t.batch_size, t.step_id,
                t.step_end_ns - t.step_start_ns, t.emit_ns, t.client_recv_ns, r.failed,
                CASE WHEN s.end_ns >= t.step_start_ns THEN s.seq ELSE -1 - t.step_start_ns END
            FROM (SELECT * FROM tokens WHERE step_id IS NULL AND step_start_ns IS NOT NULL
                  AND (SELECT by_time FROM _tokens_step_match)) AS t
            JOIN _tokens_requests_ti AS r USING (trace, request_id)
            ASOF LEFT JOIN (SELECT trace, start_ns, end_ns, seq, dur_ns, slowed_ns FROM _steps_seq
                            WHERE (SELECT count(*) FROM tokens
                                   WHERE step_id IS NULL AND step_start_ns IS NOT NULL) > 0) AS s
                ON s.trace = t.trace AND t.step_start_ns >= s.start_ns
        )
        WINDOW w AS (PARTITION BY request_key ORDER BY index)
    )
) AS g
LEFT JOIN _steps_seq AS so ON so.seq = CASE WHEN g.step_emission AND g.skey > 0 THEN g.skey END
LEFT JOIN _steps_seq AS sp ON sp.seq = CASE WHEN g.step_emission AND NOT g._adjacent AND g._p_skey > 0 THEN g._p_skey END
WHERE g.index > 0 AND g.server_itl_ms IS NOT NULL;

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

-- The exact ITL percentiles of the spilled path (flag spill_quantiles, analyzers.connection): an
-- in-memory quantile holds 8 bytes per emission however low the memory limit is, so past a share of
-- it the gaps go to a table DuckDB spills to disk, and the percentiles are read from it in two scans:
-- a histogram of fine buckets (1024 per octave of itl_ms, which is above 0 on every emission), then
-- only the values of the buckets that hold the ranks quantile_cont interpolates between, ordered
-- within their bucket. The same order statistics and the interpolation DuckDB's source writes
-- (lo * (1 - f) + hi * f), so the same numbers, except that a DuckDB build may fuse that expression
-- into one multiply-add and round once where SQL rounds twice: the last bit of an interpolated
-- percentile can differ (never an order statistic). The cost is a second ordered pass over the tokens.
-- q: the percentiles in _tokens_gap_pass's order; null on the in-memory path (whose aggregate then runs).
-- @unless spill_quantiles
CREATE OR REPLACE TEMP TABLE _tokens_itl_exact AS
SELECT NULL::DOUBLE[] AS q;

-- @when spill_quantiles
CREATE OR REPLACE TEMP TABLE _tokens_itl_values AS
SELECT itl_ms FROM tokens_gaps WHERE emission AND NOT failed;

-- @when spill_quantiles
CREATE OR REPLACE TEMP TABLE _tokens_itl_exact AS
WITH hist AS (
    SELECT floor(log2(itl_ms) * 1024)::BIGINT AS b, count(*) AS c FROM _tokens_itl_values GROUP BY b
),
cum AS (SELECT b, c, (sum(c) OVER (ORDER BY b) - c)::BIGINT AS before FROM hist),
pos AS (
    -- quantile_cont's position (n - 1) * p and the two order statistics around it (0-based ranks)
    SELECT i, (n - 1) * p AS h, floor((n - 1) * p)::BIGINT AS lo, ceil((n - 1) * p)::BIGINT AS hi
    FROM (SELECT sum(c)::BIGINT AS n FROM hist) AS t,
         (SELECT unnest([0.5, 0.9, 0.95, 0.99, 0.4, 0.6]) AS p, unnest(range(1, 7)) AS i) AS ps
    WHERE n > 0
),
need AS (
    SELECT DISTINCT cum.b, cum.before
    FROM (SELECT lo AS r FROM pos UNION SELECT hi FROM pos) AS k
    JOIN cum ON k.r >= cum.before AND k.r < cum.before + cum.c
),
ranked AS (
    SELECT r, itl_ms FROM (
        SELECT need.before + row_number() OVER (PARTITION BY need.b ORDER BY v.itl_ms) - 1 AS r, v.itl_ms
        FROM _tokens_itl_values AS v JOIN need ON floor(log2(v.itl_ms) * 1024)::BIGINT = need.b
    ) WHERE r IN (SELECT lo FROM pos UNION SELECT hi FROM pos)
)
SELECT (SELECT list(CASE WHEN pos.hi = pos.lo THEN l.itl_ms
                         ELSE l.itl_ms * (1 - (pos.h - pos.lo)) + u.itl_ms * (pos.h - pos.lo) END
                    ORDER BY pos.i)
        FROM pos JOIN ranked AS l ON l.r = pos.lo JOIN ranked AS u ON u.r = pos.hi) AS q;

-- @when spill_quantiles
DROP TABLE _tokens_itl_values;

-- The one ordered pass over the tokens (tokens_gaps) of successful requests, one row: every figure of
-- tokens_gap_stats, and the lists module tail reads (a sample of the gaps, the stalls).
-- Conditions are CASE expressions inside the aggregates (aggregates skip the nulls), not FILTER clauses:
-- DuckDB runs each FILTER as its own selection of the chunk for its aggregate, and with two dozen of them
-- the aggregate took twice the time of the same sums over CASE expressions (10M tokens: 2.2 s against
-- 1.0 s). The lists keep FILTER: list() keeps nulls.
CREATE OR REPLACE TEMP TABLE _tokens_gap_pass AS
WITH s AS (
    SELECT
        count(CASE WHEN emission THEN 1 END) AS gaps,
        count(*) AS gap_tokens,
        count(CASE WHEN emission THEN client_itl_ms END) AS client_gaps,
        favg(CASE WHEN emission THEN itl_ms END) AS itl_mean_ms,
        -- in memory unless the spilled path computed them (_tokens_itl_exact): one decision for the pass
        quantile_cont(CASE WHEN emission AND _q_in_memory THEN itl_ms END, [0.5, 0.9, 0.95, 0.99, 0.4, 0.6]) AS q,
        count(host_ms) AS host_gaps,
        sum(host_ms) AS host_sum_ms,
        sum(CASE WHEN host_ms IS NOT NULL THEN step_ms END) AS host_step_sum_ms,
        count(CASE WHEN server_itl_ms > 0 THEN kv_len END) AS itl_fit_n,
        sum(CASE WHEN server_itl_ms > 0 THEN kv_len::DOUBLE END) AS itl_fit_sx,
        sum(CASE WHEN server_itl_ms > 0 THEN kv_len::DOUBLE * kv_len END) AS itl_fit_sxx,
        sum(CASE WHEN server_itl_ms > 0 AND kv_len IS NOT NULL THEN server_itl_ms END) AS itl_fit_sy,
        sum(CASE WHEN server_itl_ms > 0 AND kv_len IS NOT NULL THEN server_itl_ms * server_itl_ms END) AS itl_fit_syy,
        sum(CASE WHEN server_itl_ms > 0 THEN kv_len * server_itl_ms END) AS itl_fit_sxy,
        count(CASE WHEN step_emission THEN 1 END) AS step_emissions,
        count(CASE WHEN _has_step THEN 1 END) AS step_tokens,
        min(step_match) AS step_match_min, max(step_match) AS step_match_max,
        -- sums of the parts; the engine gap is what is left (steps_accounting): no per-row split here
        sum(CASE WHEN step_emission THEN server_itl_ms END) AS step_itl_ms,
        sum(own_ms) AS step_own_ms,
        sum(CASE WHEN NOT preempted THEN between_prefill_ms END) AS step_prefill_wait_ms,
        sum(prefill_slowed_ms) AS step_prefill_slowed_ms,
        sum(CASE WHEN NOT preempted THEN between_other_ms END) AS step_other_decode_ms,
        sum(CASE WHEN preempted THEN server_itl_ms - own_ms END) AS step_no_step_ms,
        -- a list, not count(DISTINCT): stalls are few, and a DISTINCT aggregate slows the whole pass
        len(list_distinct(list(request_key) FILTER (WHERE preempted))) AS step_stalled_requests,
        count(CASE WHEN preempted THEN 1 END) AS step_stalls,
        max(CASE WHEN preempted THEN server_itl_ms - own_ms END) AS step_longest_stall_ms,
        -- module tail: a deterministic sample of the gaps (every gap up to tail_itl_sample decode tokens) and
        -- each preemption stall with its request. Each gap: its ITL and the step accounting's raw figures,
        -- which module tail splits as steps_emissions does; flags: 1 the request's first gap, 2 preempted,
        -- 4 a forward pass of its own, 8 an ITL measured on the client. Every field costs the pass on every
        -- row, sampled or not (about 0.1 s per 10M tokens each), and a heap of the slowest gaps (max_by with
        -- a count) half as much again as the whole sample: the tail's gaps come from the sample.
        -- The structs are built inside a CASE: an aggregate's input is computed on every row before its
        -- FILTER applies, and a struct of seven fields on 10M rows cost a second of CPU for a few thousand kept.
        list(CASE WHEN _sampled THEN struct_pack(itl_ms := itl_ms, server_itl_ms := server_itl_ms, own_ms := own_ms,
                         slowed_ms := prefill_slowed_ms, between_prefill_ms := between_prefill_ms,
                         between_other_ms := between_other_ms,
                           flags := (index = 1)::INTEGER + 2 * coalesce(preempted, false)::INTEGER
                               + 4 * coalesce(step_emission, false)::INTEGER + 8 * (client_itl_ms IS NOT NULL)::INTEGER)
                  END) FILTER (WHERE _sampled) AS sampled_gaps,
        list(CASE WHEN preempted THEN struct_pack(request_key := request_key, no_step_ms := server_itl_ms - own_ms) END)
            FILTER (WHERE preempted) AS stalls
    FROM (
        SELECT *, step_ms IS NOT NULL OR step_id IS NOT NULL AS _has_step,
            emission AND (request_key * 7919 + index) % _every = 0 AS _sampled
        FROM tokens_gaps
        CROSS JOIN (SELECT q IS NULL AS _q_in_memory FROM _tokens_itl_exact)
        CROSS JOIN (SELECT greatest(ceil(coalesce(sum(decode_tokens), 0) / any_value(t.tail_itl_sample)), 1)::BIGINT
                        AS _every
                    FROM tokens_requests, _thresholds AS t WHERE NOT failed)
    )
    WHERE NOT failed
)
SELECT
    gaps, gap_tokens, client_gaps, itl_mean_ms,
    q[1] AS itl_p50_ms, q[2] AS itl_p90_ms, q[3] AS itl_p95_ms, q[4] AS itl_p99_ms,
    q[5] AS itl_p40_ms, q[6] AS itl_p60_ms,
    host_gaps, coalesce(host_sum_ms, 0) AS host_sum_ms, coalesce(host_step_sum_ms, 0) AS host_step_sum_ms,
    itl_fit_n, coalesce(itl_fit_sx, 0) AS itl_fit_sx, coalesce(itl_fit_sxx, 0) AS itl_fit_sxx,
    coalesce(itl_fit_sy, 0) AS itl_fit_sy, coalesce(itl_fit_syy, 0) AS itl_fit_syy,
    coalesce(itl_fit_sxy, 0) AS itl_fit_sxy,
    step_emissions, step_tokens, step_match_min, step_match_max,
    coalesce(step_itl_ms, 0) AS step_itl_ms, coalesce(step_own_ms, 0) AS step_own_ms,
    coalesce(step_prefill_wait_ms, 0) AS step_prefill_wait_ms,
    coalesce(step_prefill_slowed_ms, 0) AS step_prefill_slowed_ms,
    coalesce(step_other_decode_ms, 0) AS step_other_decode_ms,
    coalesce(step_itl_ms - step_own_ms - coalesce(step_prefill_wait_ms, 0) - coalesce(step_other_decode_ms, 0)
        - coalesce(step_no_step_ms, 0), 0) AS step_engine_gap_ms,
    coalesce(step_no_step_ms, 0) AS step_no_step_ms,
    step_stalled_requests, step_stalls, step_longest_stall_ms,
    sampled_gaps, stalls
FROM (SELECT * EXCLUDE (q), coalesce((SELECT q FROM _tokens_itl_exact), s.q) AS q FROM s) AS s;

-- @table tokens_gap_stats
-- The statistics that need tokens in order (they use each token's gap to the
-- previous one), from the one ordered pass over tokens_gaps of successful requests: ITL
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
-- @column itl_p40_ms: 40th percentile ITL, milliseconds (module tail: typical gaps lie between p40 and p60).
-- @column itl_p60_ms: 60th percentile ITL, milliseconds.
-- @column host_gaps: Emissions with both a server-side gap and a step time (count).
-- @column host_sum_ms: Sum of host_ms (server gap minus step time, not below 0) over those, milliseconds.
-- @column host_step_sum_ms: Sum of step time over those, milliseconds.
-- @column itl_fit_n: Emissions with kv_len (count): the ITL fit and the roofline's ITL basis.
-- @column itl_fit_sx: Sum of kv_len over those tokens, tokens.
-- @column itl_fit_sxx: Sum of kv_len squared, tokens squared.
-- @column itl_fit_sy: Sum of server-side ITL, milliseconds.
-- @column itl_fit_syy: Sum of server-side ITL squared, milliseconds squared.
-- @column itl_fit_sxy: Sum of kv_len times server-side ITL, token-milliseconds.
-- @column step_emissions: Forward passes of those requests after token 0 (count).
-- @column step_tokens: Tokens after token 0 with a step time (count).
-- @column step_match_min: Smallest tokens_gaps.step_match (null without step information).
-- @column step_match_max: Largest tokens_gaps.step_match.
-- @column step_itl_ms: Sum of the server-side gaps of those passes, milliseconds.
-- @column step_own_ms: Sum of own_ms, milliseconds.
-- @column step_prefill_wait_ms: Sum of between_prefill_ms over passes not preempted, milliseconds.
-- @column step_prefill_slowed_ms: Sum of prefill_slowed_ms, milliseconds.
-- @column step_other_decode_ms: Sum of between_other_ms over passes not preempted, milliseconds.
-- @column step_engine_gap_ms: What is left of step_itl_ms: time in no iteration (host and scheduler), milliseconds.
-- @column step_no_step_ms: Sum of the waits (gap minus own pass) of preempted passes, milliseconds.
-- @column step_stalled_requests: Requests with a preemption stall (count).
-- @column step_stalls: Preemption stalls (count).
-- @column step_longest_stall_ms: Longest preemption stall, milliseconds.
CREATE OR REPLACE TEMP TABLE tokens_gap_stats AS
SELECT gaps, gap_tokens, client_gaps, itl_mean_ms, itl_p50_ms, itl_p90_ms, itl_p95_ms, itl_p99_ms,
    itl_p40_ms, itl_p60_ms, host_gaps, host_sum_ms, host_step_sum_ms, itl_fit_n, itl_fit_sx, itl_fit_sxx,
    itl_fit_sy, itl_fit_syy, itl_fit_sxy, step_emissions, step_tokens, step_match_min, step_match_max,
    step_itl_ms, step_own_ms, step_prefill_wait_ms, step_prefill_slowed_ms, step_other_decode_ms,
    step_engine_gap_ms, step_no_step_ms, step_stalled_requests, step_stalls, step_longest_stall_ms
FROM _tokens_gap_pass
