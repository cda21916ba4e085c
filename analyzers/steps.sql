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
-- @column decode_only_steps: Iterations with this batch size that decode and prefill nothing (count).
-- @column decode_only_mean_step_ms: Mean time of those decode-only iterations (no prompt stretching them), milliseconds; NULL when none.
CREATE OR REPLACE TEMP TABLE steps_batch AS
SELECT
    batch_size,
    count(*) AS steps,
    avg((end_ns - start_ns) / 1e6) AS mean_step_ms,
    quantile_cont((end_ns - start_ns) / 1e6, 0.5) AS p50_step_ms,
    avg(prefill_tokens) AS mean_prefill_tokens,
    avg(decode_tokens) AS mean_decode_tokens,
    avg(kv_tokens) AS mean_kv_tokens,
    sum((end_ns - start_ns) / 1e6) / nullif(sum(decode_tokens), 0) AS ms_per_decode_token,
    count(*) FILTER (WHERE prefill_tokens = 0 AND decode_tokens > 0) AS decode_only_steps,
    avg((end_ns - start_ns) / 1e6) FILTER (WHERE prefill_tokens = 0 AND decode_tokens > 0)
        AS decode_only_mean_step_ms
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

-- How a request's passes were found (tokens_gaps.step_match) in words.
CREATE OR REPLACE MACRO _steps_match(code) AS
    CASE code WHEN 0 THEN 'step_id' WHEN 1 THEN 'step-times' WHEN 2 THEN 'token-steps' ELSE 'mixed' END;

-- @view steps_emissions
-- One row per emission of decode tokens: the tokens one forward pass gave a request
-- (index > 0; several under speculative decoding), and how the time since its previous
-- emission splits. Emissions are found in one ordered pass over the tokens (integer
-- request keys, as tokens_gaps): a token opens an emission when its step differs from
-- its predecessor's. The rows of tokens_gaps that open a forward pass (step_emission),
-- computed when queried: for one request filter on request_key.
-- @column request_key: Integer key of the request (tokens_requests).
-- @column first_index: Index of the emission's first token.
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
CREATE OR REPLACE VIEW steps_emissions AS
WITH e AS (
    SELECT *, greatest(server_itl_ms - own_ms, 0) AS _wait,
        CASE WHEN preempted THEN 0 ELSE least(greatest(coalesce(between_prefill_ms, 0), 0),
                                              greatest(server_itl_ms - own_ms, 0)) END AS _pw
    FROM tokens_gaps
    WHERE step_emission
),
f AS (
    SELECT *, CASE WHEN preempted THEN 0 ELSE least(greatest(coalesce(between_other_ms, 0), 0), _wait - _pw) END AS _od,
        CASE WHEN preempted THEN _wait ELSE 0 END AS _ns
    FROM e
)
SELECT request_key, index AS first_index, _steps_match(step_match) AS match, server_itl_ms AS itl_ms, own_ms,
    prefill_slowed_ms, _pw AS prefill_wait_ms, _od AS other_decode_ms, _wait - _pw - _od - _ns AS engine_gap_ms,
    _ns AS no_step_ms, skipped_decode_steps, failed
FROM f;

-- @view steps_requests
-- One row per request with emissions: its decode time split as in steps_emissions
-- (computed when queried; steps_accounting's totals come from tokens_gap_stats).
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
CREATE OR REPLACE VIEW steps_requests AS
WITH g AS (
    SELECT request_key, count(*) AS emissions, sum(itl_ms) AS itl_ms,
        sum(own_ms) AS own_ms, sum(prefill_slowed_ms) AS prefill_slowed_ms, sum(prefill_wait_ms) AS prefill_wait_ms,
        sum(other_decode_ms) AS other_decode_ms, sum(engine_gap_ms) AS engine_gap_ms, sum(no_step_ms) AS no_step_ms,
        count(*) FILTER (WHERE no_step_ms > 0) AS stalls,
        max(no_step_ms) FILTER (WHERE no_step_ms > 0) AS longest_stall_ms,
        CASE WHEN min(match) = max(match) THEN min(match) ELSE 'mixed' END AS match
    FROM steps_emissions
    GROUP BY request_key
)
SELECT r.trace, r.request_id, g.request_key, g.emissions, r.decode_tokens::BIGINT AS tokens,
    g.* EXCLUDE (request_key, emissions), r.failed
FROM g JOIN tokens_requests AS r USING (request_key);

-- @table steps_accounting
-- One row: the split of steps_requests over successful requests, as totals and shares of the
-- decode time (the sum of itl_ms). Null shares when no request has emissions.
-- @column basis: How own steps were found: 'step_id', 'step-times', 'token-steps' or 'mixed'; null without step information.
-- @column requests: Successful requests with decode tokens (count).
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
SELECT _steps_match(CASE WHEN step_match_min = step_match_max THEN step_match_min ELSE 3 END) AS basis,
    (SELECT count(*) FROM tokens_requests WHERE NOT failed AND decode_tokens > 0) AS requests,
    step_emissions AS emissions, step_tokens AS tokens,
    step_tokens / nullif(step_emissions, 0) AS tokens_per_step, step_itl_ms AS itl_ms,
    step_own_ms / nullif(step_itl_ms, 0) AS own_share,
    (step_prefill_wait_ms + step_prefill_slowed_ms) / nullif(step_itl_ms, 0) AS prefill_share,
    step_prefill_wait_ms AS prefill_wait_ms, step_prefill_slowed_ms AS prefill_slowed_ms,
    step_other_decode_ms / nullif(step_itl_ms, 0) AS other_decode_share,
    step_engine_gap_ms / nullif(step_itl_ms, 0) AS engine_gap_share,
    step_engine_gap_ms / nullif(step_emissions, 0) AS engine_gap_mean_ms,
    step_no_step_ms / nullif(step_itl_ms, 0) AS no_step_share, step_no_step_ms AS no_step_ms,
    step_stalled_requests AS stalled_requests, step_stalls AS stalls, step_longest_stall_ms AS longest_stall_ms
FROM tokens_gap_stats;
