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
SELECT trace, step_id, start_ns, end_ns, prefill_tokens, decode_tokens, batch_size, kv_tokens,
    end_ns - start_ns AS dur_ns,
    row_number() OVER w AS seq,
    sum(CASE WHEN prefill_tokens > 0 THEN end_ns - start_ns ELSE 0 END) OVER w AS cum_prefill_ns,
    sum(CASE WHEN prefill_tokens > 0 THEN 0 ELSE end_ns - start_ns END) OVER w AS cum_other_ns,
    sum(CASE WHEN decode_tokens > 0 THEN 1 ELSE 0 END) OVER w AS cum_decode_steps
FROM steps
WINDOW w AS (PARTITION BY trace ORDER BY start_ns, step_id ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW);

-- @table steps_emissions
-- One row per emission of a decode token: the forward pass that gave a request one
-- or more tokens (index > 0), and how the time since its previous emission splits.
-- @column trace: Trace label.
-- @column request_id: Request id.
-- @column first_index: Smallest token index of the emission.
-- @column tokens: Tokens of the emission (count; above 1 under speculative decoding).
-- @column emit_ns: Server clock, nanoseconds: the emission's latest emit_ns.
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
CREATE OR REPLACE TEMP TABLE steps_emissions AS
WITH em AS (
    SELECT trace, request_id, step_id, step_start_ns AS s0, step_end_ns AS s1,
        min(index) AS first_index, count(*) AS tokens, max(emit_ns) AS emit_ns
    FROM tokens
    WHERE request_id <> '' AND (step_id IS NOT NULL OR step_start_ns IS NOT NULL)
    GROUP BY trace, request_id, step_id, step_start_ns, step_end_ns
),
by_id AS (
    SELECT em.*, s.seq, s.dur_ns, s.prefill_tokens, s.decode_tokens, s.cum_prefill_ns, s.cum_other_ns,
        s.cum_decode_steps
    FROM em LEFT JOIN _steps_seq AS s ON s.trace = em.trace AND s.step_id = em.step_id
    WHERE em.step_id IS NOT NULL
),
by_time AS (
    SELECT em.*, s.seq, s.dur_ns, s.prefill_tokens, s.decode_tokens, s.cum_prefill_ns, s.cum_other_ns,
        s.cum_decode_steps, s.end_ns AS _s_end
    FROM (SELECT * FROM em WHERE step_id IS NULL) AS em
    ASOF LEFT JOIN _steps_seq AS s ON s.trace = em.trace AND em.s0 >= s.start_ns
),
j AS (
    SELECT * FROM by_id
    UNION ALL
    SELECT * EXCLUDE (_s_end) REPLACE (
        CASE WHEN _s_end >= s0 THEN seq END AS seq, CASE WHEN _s_end >= s0 THEN dur_ns END AS dur_ns)
    FROM by_time
),
l AS (
    SELECT *,
        CASE WHEN seq IS NULL THEN 'token-steps' WHEN step_id IS NULL THEN 'step-times' ELSE 'step_id' END AS match,
        emit_ns - lag(emit_ns) OVER r AS _itl_ns,
        coalesce(dur_ns, s1 - s0) AS _own_ns,
        -- the iterations strictly between the previous emission's pass and this one's
        cum_prefill_ns - CASE WHEN prefill_tokens > 0 THEN dur_ns ELSE 0 END - lag(cum_prefill_ns) OVER r
            AS _between_prefill_ns,
        cum_other_ns - CASE WHEN prefill_tokens > 0 THEN 0 ELSE dur_ns END - lag(cum_other_ns) OVER r
            AS _between_other_ns,
        cum_decode_steps - CASE WHEN decode_tokens > 0 THEN 1 ELSE 0 END - lag(cum_decode_steps) OVER r
            AS skipped_decode_steps
    FROM j
    WINDOW r AS (PARTITION BY trace, request_id ORDER BY first_index)
),
c AS (
    SELECT l.*, greatest(_itl_ns - _own_ns, 0) AS _wait_ns,
        coalesce(skipped_decode_steps >= t.preemption_min_steps, false) AS _stalled,
        b.decode_only_ns
    FROM l
    CROSS JOIN _thresholds AS t
    LEFT JOIN (SELECT trace, avg(dur_ns) FILTER (WHERE prefill_tokens = 0 AND decode_tokens > 0) AS decode_only_ns
               FROM _steps_seq GROUP BY trace) AS b USING (trace)
    WHERE first_index > 0 AND _itl_ns IS NOT NULL
),
p AS (
    SELECT *,
        CASE WHEN _stalled THEN 0 ELSE least(greatest(coalesce(_between_prefill_ns, 0), 0), _wait_ns) END AS _pw,
        CASE WHEN _stalled THEN _wait_ns ELSE 0 END AS _ns
    FROM c
),
q AS (
    SELECT *, CASE WHEN _stalled THEN 0
                   ELSE least(greatest(coalesce(_between_other_ns, 0), 0), _wait_ns - _pw) END AS _od
    FROM p
)
SELECT trace, request_id, first_index, tokens, emit_ns, match,
    _itl_ns / 1e6 AS itl_ms, _own_ns / 1e6 AS own_ms,
    CASE WHEN prefill_tokens > 0 THEN greatest(_own_ns - coalesce(decode_only_ns, _own_ns), 0) ELSE 0 END / 1e6
        AS prefill_slowed_ms,
    _pw / 1e6 AS prefill_wait_ms, _od / 1e6 AS other_decode_ms,
    (_wait_ns - _pw - _od - _ns) / 1e6 AS engine_gap_ms, _ns / 1e6 AS no_step_ms,
    skipped_decode_steps,
    coalesce(r.failed, false) AS failed
FROM q
LEFT JOIN (SELECT trace, request_id, failed FROM tokens_requests) AS r USING (trace, request_id);

-- @table steps_requests
-- One row per request with emissions: its decode time split as in steps_emissions.
-- @column trace: Trace label.
-- @column request_id: Request id.
-- @column emissions: Emissions after token 0 (count).
-- @column tokens: Decode tokens in them (count).
-- @column itl_ms: Token 0 to the last emission, milliseconds: the sum of the parts below.
-- @column own_ms: In its own forward passes, milliseconds.
-- @column prefill_slowed_ms: Of own_ms, the stretch of passes that also prefilled, milliseconds.
-- @column prefill_wait_ms: In other iterations with prefill work, milliseconds.
-- @column other_decode_ms: In other iterations without prefill, milliseconds.
-- @column engine_gap_ms: Between iterations (host and scheduler), milliseconds.
-- @column no_step_ms: Preempted: no step while the engine kept stepping, milliseconds.
-- @column stalls: Waits counted as preemption (count).
-- @column longest_stall_ms: Longest of them, milliseconds (null without one).
-- @column failed: True when the request failed.
CREATE OR REPLACE TEMP TABLE steps_requests AS
SELECT trace, request_id, count(*) AS emissions, sum(tokens)::BIGINT AS tokens, sum(itl_ms) AS itl_ms,
    sum(own_ms) AS own_ms, sum(prefill_slowed_ms) AS prefill_slowed_ms, sum(prefill_wait_ms) AS prefill_wait_ms,
    sum(other_decode_ms) AS other_decode_ms, sum(engine_gap_ms) AS engine_gap_ms, sum(no_step_ms) AS no_step_ms,
    count(*) FILTER (WHERE no_step_ms > 0) AS stalls,
    max(no_step_ms) FILTER (WHERE no_step_ms > 0) AS longest_stall_ms,
    bool_or(failed) AS failed
FROM steps_emissions
GROUP BY trace, request_id;

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
WITH e AS (SELECT * FROM steps_emissions WHERE NOT failed),
r AS (SELECT * FROM steps_requests WHERE NOT failed),
a AS (
    SELECT CASE WHEN min(match) = max(match) THEN min(match) WHEN count(*) > 0 THEN 'mixed' END AS basis,
        count(*) AS emissions, sum(tokens) AS tokens, fsum(itl_ms) AS itl, fsum(own_ms) AS own,
        fsum(prefill_wait_ms) AS pw, fsum(prefill_slowed_ms) AS ps, fsum(other_decode_ms) AS od,
        fsum(engine_gap_ms) AS eg, fsum(no_step_ms) AS ns
    FROM e
)
SELECT basis, (SELECT count(*) FROM r) AS requests, emissions, coalesce(tokens, 0)::BIGINT AS tokens,
    tokens / nullif(emissions, 0) AS tokens_per_step, itl AS itl_ms,
    own / nullif(itl, 0) AS own_share, (pw + ps) / nullif(itl, 0) AS prefill_share,
    pw AS prefill_wait_ms, ps AS prefill_slowed_ms,
    od / nullif(itl, 0) AS other_decode_share, eg / nullif(itl, 0) AS engine_gap_share,
    eg / nullif(emissions, 0) AS engine_gap_mean_ms,
    ns / nullif(itl, 0) AS no_step_share, ns AS no_step_ms,
    (SELECT count(*) FILTER (WHERE stalls > 0) FROM r) AS stalled_requests,
    (SELECT coalesce(sum(stalls), 0) FROM r)::BIGINT AS stalls,
    (SELECT max(longest_stall_ms) FROM r) AS longest_stall_ms
FROM a;
