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

-- Per-request step accounting (docs/findings.md, "Where a request's decode time goes").
-- A request's decode time, token 0 to its last token, is cut per emission (the tokens
-- one forward pass gave it: one, or several under speculative decoding) into:
--   own step      the forward pass that produced the emission;
--   prefill wait  other iterations it waited through that carried prefill work;
--   other decode  other iterations without prefill that ran while it waited;
--   engine gap    time in no iteration at all: the engine's scheduling, sampling,
--                 detokenize and Python between steps, the only host overhead;
--   no step       the whole wait when the engine ran at least preemption_min_steps
--                 decode iterations without the request: it was not running (preempted).
-- A request's own steps come from tokens.step_id, else from the step whose times hold
-- the token's step_start_ns, else (no steps table) from the token's step times alone,
-- which cannot see other iterations: then all waiting counts as engine gap.

-- Steps of each trace in time order, with running sums that make "the iterations
-- between two of a request's steps" two lookups instead of a range join.
CREATE OR REPLACE TEMP TABLE _steps_seq AS
WITH s AS (
    SELECT trace, step_id, start_ns, end_ns, prefill_tokens, decode_tokens, batch_size, kv_tokens, x.ti,
        end_ns - start_ns AS dur_ns,
        row_number() OVER w AS n,
        -- the trace's mean decode-only step: what a step that also prefilled is compared with
        avg(CASE WHEN prefill_tokens = 0 AND decode_tokens > 0 THEN end_ns - start_ns END) OVER (PARTITION BY trace)
            AS decode_only_ns,
        -- BIGINT, not the HUGEINT a sum of BIGINTs gives: 128-bit values double what the ordered pass moves
        (sum(CASE WHEN prefill_tokens > 0 THEN end_ns - start_ns ELSE 0 END) OVER w)::BIGINT AS cum_prefill_ns,
        (sum(CASE WHEN prefill_tokens > 0 THEN 0 ELSE end_ns - start_ns END) OVER w)::BIGINT AS cum_other_ns,
        (sum(CASE WHEN decode_tokens > 0 THEN 1 ELSE 0 END) OVER w)::BIGINT AS cum_decode_steps,
        start_ns - lag(end_ns) OVER w AS gap_ns
    FROM steps JOIN (SELECT trace, row_number() OVER (ORDER BY trace) AS ti FROM _traces) AS x USING (trace)
    WINDOW w AS (PARTITION BY trace ORDER BY start_ns, step_id ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT * EXCLUDE (ti, n),
    -- unique over every trace (the trace's position in the high bits): joins on one integer
    ti * 1099511627776 + n AS seq,
    ti * 1099511627776 + step_id AS id_key,
    CASE WHEN prefill_tokens > 0 THEN greatest(dur_ns - coalesce(decode_only_ns, dur_ns), 0) ELSE 0 END AS slowed_ns
FROM s;

-- @view steps_emissions
-- One row per emission of decode tokens: the tokens one forward pass gave a request
-- (index > 0; several under speculative decoding), and how the time since its previous
-- emission splits. Emissions are found in one ordered pass over the tokens (integer
-- request keys, as tokens_gaps): a token opens an emission when its step differs from
-- its predecessor's. A view (computed when queried; steps_requests aggregates it in
-- one pass): for one request filter on request_key.
-- @column request_key: Integer key of the request (tokens_requests).
-- @column first_index: Index of the emission's first token.
-- @column emit_ns: Server clock, nanoseconds: the emit time of the emission's first token.
-- @column match: How the forward pass was found: 'step_id', 'step-times' (the steps row holding the token's step_start_ns) or 'token-steps' (the token's own step times; no steps row).
-- @column itl_ms: Time since the previous emission, milliseconds (server clock).
-- @column own_ms: The emission's own forward pass, milliseconds.
-- @column prefill_slowed_ms: Of own_ms, the part beyond a decode-only step of the trace when the pass also prefilled, milliseconds.
-- @column prefill_wait_ms: Other iterations with prefill work waited through, milliseconds.
-- @column other_decode_ms: Other iterations without prefill waited through, milliseconds.
-- @column engine_gap_ms: Waiting in no iteration (between steps, before the emit), milliseconds.
-- @column no_step_ms: The whole wait when the request missed preemption_min_steps decode iterations or more (preempted), milliseconds.
-- @column skipped_decode_steps: Decode iterations the engine ran between this emission's pass and the previous one (count; null without a steps row).
-- @column failed: True when the request failed.
-- A request's tokens with its integer key and its trace's position (no CTE: one referenced
-- twice would be materialised, a million rows written and read back).
CREATE OR REPLACE VIEW _steps_tokens AS
SELECT t.trace, r.request_key, r._ti, t.index, t.emit_ns, t.step_id, t.step_start_ns, t.step_end_ns, r.failed
FROM tokens AS t
JOIN (SELECT r.trace, r.request_id, r.request_key, r.failed, x.ti * 1099511627776 AS _ti
      FROM tokens_requests AS r
      JOIN (SELECT trace, row_number() OVER (ORDER BY trace) AS ti FROM _traces) AS x USING (trace)) AS r
    USING (trace, request_id);

CREATE OR REPLACE VIEW _steps_emission_rows AS
WITH
-- each token's forward pass: by step_id, else the steps row whose start is the latest at or
-- before the token's step_start_ns and whose end is not before it. The ASOF join sorts both
-- sides, so its steps side is empty unless some token lacks a step_id. Only integers go on
-- into the ordered pass (strings make the sort several times slower), and only what it needs:
-- a step key (the step's seq, else minus the token's step start), the pass's own time, and the
-- running sums up to and including it (the part before it follows from its kind).
j AS (
    SELECT k.request_key, k.index, k.emit_ns, k.failed, (0)::TINYINT AS match_code,
        coalesce(s.seq, -1 - k.step_start_ns) AS skey, coalesce(s.dur_ns, k.step_end_ns - k.step_start_ns) AS own_ns,
        s.slowed_ns, s.prefill_tokens > 0 AS is_prefill, s.decode_tokens > 0 AS is_decode,
        s.cum_prefill_ns, s.cum_other_ns, s.cum_decode_steps
    FROM (SELECT * FROM _steps_tokens WHERE step_id IS NOT NULL) AS k
    LEFT JOIN _steps_seq AS s ON s.id_key = k._ti + k.step_id
    UNION ALL
    SELECT request_key, index, emit_ns, failed, (1)::TINYINT,
        CASE WHEN hit THEN seq ELSE -1 - step_start_ns END, CASE WHEN hit THEN dur_ns ELSE step_end_ns - step_start_ns END,
        CASE WHEN hit THEN slowed_ns END, CASE WHEN hit THEN prefill_tokens > 0 END,
        CASE WHEN hit THEN decode_tokens > 0 END, CASE WHEN hit THEN cum_prefill_ns END,
        CASE WHEN hit THEN cum_other_ns END, CASE WHEN hit THEN cum_decode_steps END
    FROM (
        SELECT k.*, s.* EXCLUDE (trace, step_id), s.end_ns >= k.step_start_ns AS hit
        FROM (SELECT * FROM _steps_tokens WHERE step_id IS NULL AND step_start_ns IS NOT NULL) AS k
        ASOF LEFT JOIN (SELECT * FROM _steps_seq
                        WHERE (SELECT count(*) FROM tokens WHERE step_id IS NULL AND step_start_ns IS NOT NULL) > 0) AS s
            ON s.trace = k.trace AND k.step_start_ns >= s.start_ns
    )
),
l AS (
    SELECT *, lag(emit_ns) OVER r AS _p_emit, lag(skey) OVER r AS _p_skey,
        lag(cum_prefill_ns) OVER r AS _p_cum_prefill, lag(cum_other_ns) OVER r AS _p_cum_other,
        lag(cum_decode_steps) OVER r AS _p_cum_decode
    FROM j
    WINDOW r AS (PARTITION BY request_key ORDER BY index)
),
c AS (
    SELECT *,
        -- 0 step_id, 1 step-times, 2 token-steps (an integer: min/max of strings per group cost 5x more)
        CASE WHEN cum_decode_steps IS NULL THEN 2 ELSE match_code END AS _match,
        emit_ns - _p_emit AS _itl_ns,
        -- the iterations strictly between the previous emission's pass and this one's
        cum_prefill_ns - CASE WHEN is_prefill THEN own_ns ELSE 0 END - _p_cum_prefill AS _between_prefill_ns,
        cum_other_ns - CASE WHEN is_prefill THEN 0 ELSE own_ns END - _p_cum_other AS _between_other_ns,
        cum_decode_steps - CASE WHEN is_decode THEN 1 ELSE 0 END - _p_cum_decode AS skipped_decode_steps
    FROM l
    WHERE index > 0 AND _p_emit IS NOT NULL AND skey IS DISTINCT FROM _p_skey
),
d AS (
    SELECT c.*, greatest(_itl_ns - own_ns, 0) AS _wait_ns,
        coalesce(skipped_decode_steps >= (SELECT preemption_min_steps FROM _thresholds), false) AS _stalled
    FROM c
),
p AS (
    SELECT *,
        CASE WHEN _stalled THEN 0 ELSE least(greatest(coalesce(_between_prefill_ns, 0), 0), _wait_ns) END AS _pw,
        CASE WHEN _stalled THEN _wait_ns ELSE 0 END AS _ns
    FROM d
),
q AS (
    SELECT *, CASE WHEN _stalled THEN 0
                   ELSE least(greatest(coalesce(_between_other_ns, 0), 0), _wait_ns - _pw) END AS _od
    FROM p
)
SELECT request_key, index AS first_index, emit_ns, _match AS match_code,
    _itl_ns / 1e6 AS itl_ms, own_ns / 1e6 AS own_ms, coalesce(slowed_ns, 0) / 1e6 AS prefill_slowed_ms,
    _pw / 1e6 AS prefill_wait_ms, _od / 1e6 AS other_decode_ms,
    (_wait_ns - _pw - _od - _ns) / 1e6 AS engine_gap_ms, _ns / 1e6 AS no_step_ms,
    skipped_decode_steps, failed
FROM q;

CREATE OR REPLACE MACRO _steps_match(code) AS
    CASE code WHEN 0 THEN 'step_id' WHEN 1 THEN 'step-times' WHEN 2 THEN 'token-steps' ELSE 'mixed' END;

CREATE OR REPLACE VIEW steps_emissions AS
SELECT request_key, first_index, emit_ns, _steps_match(match_code) AS match, itl_ms, own_ms, prefill_slowed_ms,
    prefill_wait_ms, other_decode_ms, engine_gap_ms, no_step_ms, skipped_decode_steps, failed
FROM _steps_emission_rows;

-- @table steps_requests
-- One row per request with emissions: its decode time split as in steps_emissions.
-- @column trace: Trace label.
-- @column request_id: Request id.
-- @column request_key: Integer key of the request.
-- @column emissions: Emissions after token 0 (count).
-- @column tokens: Decode tokens of the request (tokens_requests.decode_tokens) (count).
-- @column itl_ms: Token 0 to the last emission, milliseconds: the sum of the parts below.
-- @column own_ms: In its own forward passes, milliseconds.
-- @column prefill_slowed_ms: Of own_ms, the stretch of passes that also prefilled, milliseconds.
-- @column prefill_wait_ms: In other iterations with prefill work, milliseconds.
-- @column other_decode_ms: In other iterations without prefill, milliseconds.
-- @column engine_gap_ms: Between iterations (host and scheduler), milliseconds.
-- @column no_step_ms: Preempted: no step while the engine kept stepping, milliseconds.
-- @column stalls: Waits counted as preemption (count).
-- @column longest_stall_ms: Longest of them, milliseconds (null without one).
-- @column match: How its passes were found (steps_emissions.match), or 'mixed'.
-- @column failed: True when the request failed.
CREATE OR REPLACE TEMP TABLE steps_requests AS
WITH g AS (
    SELECT request_key, count(*) AS emissions, sum(itl_ms) AS itl_ms,
        sum(own_ms) AS own_ms, sum(prefill_slowed_ms) AS prefill_slowed_ms, sum(prefill_wait_ms) AS prefill_wait_ms,
        sum(other_decode_ms) AS other_decode_ms, sum(engine_gap_ms) AS engine_gap_ms, sum(no_step_ms) AS no_step_ms,
        count(*) FILTER (WHERE no_step_ms > 0) AS stalls,
        max(no_step_ms) FILTER (WHERE no_step_ms > 0) AS longest_stall_ms,
        CASE WHEN min(match_code) = max(match_code) THEN min(match_code) ELSE 3 END AS match_code
    FROM _steps_emission_rows
    GROUP BY request_key
)
SELECT r.trace, r.request_id, g.request_key, g.emissions, r.decode_tokens::BIGINT AS tokens,
    g.* EXCLUDE (request_key, emissions, match_code), _steps_match(g.match_code) AS match, r.failed
FROM g JOIN tokens_requests AS r USING (request_key);

-- @table steps_accounting
-- One row: the split of steps_requests over successful requests, as totals and shares of the
-- decode time (the sum of itl_ms). Null shares when no request has emissions.
-- @column basis: How own steps were found: 'step_id', 'step-times', 'token-steps' or 'mixed'; null without step information.
-- @column requests: Successful requests with emissions (count).
-- @column emissions: Their emissions (count).
-- @column tokens: Their decode tokens (count).
-- @column tokens_per_step: tokens / emissions: mean tokens a request got per forward pass (accepted tokens under speculative decoding).
-- @column itl_ms: Decode time, summed over requests, milliseconds.
-- @column own_share: Share in the requests' own forward passes, 0..1.
-- @column prefill_share: Share lost to prefill work: waits through prefill iterations plus the stretch of own passes that prefilled, 0..1.
-- @column prefill_wait_ms: Waits through prefill iterations, summed, milliseconds.
-- @column prefill_slowed_ms: Stretch of own passes that prefilled, summed, milliseconds.
-- @column other_decode_share: Share in other iterations without prefill, 0..1.
-- @column engine_gap_share: Share between iterations (host and scheduler), 0..1.
-- @column engine_gap_mean_ms: Engine gap per emission, milliseconds.
-- @column no_step_share: Share preempted (no step while the engine kept stepping), 0..1.
-- @column no_step_ms: Preempted time, summed, milliseconds.
-- @column stalled_requests: Requests with at least one preemption stall (count).
-- @column stalls: Preemption stalls (count).
-- @column longest_stall_ms: Longest stall, milliseconds.
CREATE OR REPLACE TEMP TABLE steps_accounting AS
WITH r AS (SELECT * FROM steps_requests WHERE NOT failed),
a AS (
    SELECT CASE WHEN min(match) = max(match) THEN min(match) WHEN count(*) > 0 THEN 'mixed' END AS basis,
        count(*) AS requests, sum(emissions) AS emissions, sum(tokens) AS tokens, fsum(itl_ms) AS itl,
        fsum(own_ms) AS own, fsum(prefill_wait_ms) AS pw, fsum(prefill_slowed_ms) AS ps,
        fsum(other_decode_ms) AS od, fsum(engine_gap_ms) AS eg, fsum(no_step_ms) AS ns,
        count(*) FILTER (WHERE stalls > 0) AS stalled_requests, sum(stalls) AS stalls,
        max(longest_stall_ms) AS longest_stall_ms
    FROM r
)
SELECT basis, requests, coalesce(emissions, 0)::BIGINT AS emissions, coalesce(tokens, 0)::BIGINT AS tokens,
    tokens / nullif(emissions, 0) AS tokens_per_step, itl AS itl_ms,
    own / nullif(itl, 0) AS own_share, (pw + ps) / nullif(itl, 0) AS prefill_share,
    pw AS prefill_wait_ms, ps AS prefill_slowed_ms,
    od / nullif(itl, 0) AS other_decode_share, eg / nullif(itl, 0) AS engine_gap_share,
    eg / nullif(emissions, 0) AS engine_gap_mean_ms,
    ns / nullif(itl, 0) AS no_step_share, ns AS no_step_ms,
    stalled_requests, coalesce(stalls, 0)::BIGINT AS stalls, longest_stall_ms
FROM a;
