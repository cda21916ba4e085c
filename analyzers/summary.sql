-- Module summary: the key numbers of an analysis in one row, the evidence that
-- findings and claim verdicts quote. Nothing new is measured here; every column
-- is read from another module's table. The _ms/_pct/_n/_f macros format numbers
-- for the texts of findings and claims as every other surface prints them (tracetool.units,
-- tracetool.glyphs): µs below 0.1 ms, and an en dash, never a hyphen, for a value not measured.

CREATE OR REPLACE MACRO _ms(x) AS coalesce(CASE
    WHEN abs(x) >= 1000 THEN printf('%.2f s', x / 1000)
    WHEN abs(x) >= 10 THEN printf('%.1f ms', x)
    WHEN abs(x) >= 0.1 OR x = 0 THEN printf('%.2f ms', x)
    ELSE printf('%.1f µs', x * 1000) END, '–');
CREATE OR REPLACE MACRO _pct(x) AS coalesce(CASE WHEN x > 0 AND x < 0.001 THEN printf('%.3f %%', x * 100)
    ELSE printf('%.1f %%', x * 100) END, '–');
CREATE OR REPLACE MACRO _n(x) AS coalesce(format('{:,.0f}', x::DOUBLE), '–');
CREATE OR REPLACE MACRO _f(x, d) AS coalesce(printf('%.' || d || 'f', x), '–');


-- @table summary_numbers
-- One row of headline numbers (nulls where the trace cannot say).
-- @column traces: Traces in this analysis (count).
-- @column requests: Requests seen in spans, tokens or requests (count).
-- @column failed_requests: Requests with status 'error' (count).
-- @column e2e_requests: Successful requests with an e2e (count): the attribution's population.
-- @column e2e_mean_ms: Mean e2e, milliseconds.
-- @column ttft_mean_ms: Mean TTFT, milliseconds.
-- @column ttft_share: Mean TTFT / mean e2e over requests with both, 0..1.
-- @column itl_mean_ms: Mean ITL, milliseconds.
-- @column itl_p50_ms: Median ITL, milliseconds.
-- @column tpot_mean_ms: Mean TPOT, milliseconds.
-- @column output_tokens_p50: Median output tokens per request, tokens.
-- @column output_tokens_mean: Mean output tokens per request, tokens.
-- @column prompt_tokens_mean: Mean prompt tokens per request (where recorded), tokens.
-- @column network_ms: Mean network time per measuring request, milliseconds.
-- @column network_share: Network share of e2e, 0..1 (null when not measured).
-- @column frontend_ms: Mean time the server spent outside its engine's span (frontend), milliseconds.
-- @column frontend_share: Frontend share of e2e, 0..1 (null when not measured).
-- @column queue_ms: Mean queue time, milliseconds.
-- @column queue_share: Queue share of e2e, 0..1.
-- @column tokenize_ms: Mean tokenize time, milliseconds.
-- @column tokenize_share: Tokenize share of e2e, 0..1.
-- @column preprocess_ms: Mean preprocess time, milliseconds.
-- @column preprocess_share: Preprocess share of e2e, 0..1.
-- @column prefill_ms: Mean prefill time, milliseconds.
-- @column prefill_share: Prefill share of e2e, 0..1.
-- @column decode_ms: Mean decode time, milliseconds.
-- @column decode_share: Decode share of e2e, 0..1.
-- @column detokenize_ms: Mean detokenize time, milliseconds.
-- @column detokenize_share: Detokenize share of e2e, 0..1.
-- @column postprocess_ms: Mean postprocess time, milliseconds.
-- @column postprocess_share: Postprocess share of e2e, 0..1.
-- @column other_ms: Mean unattributed server time, milliseconds.
-- @column other_share: Other share of e2e, 0..1.
-- @column bottleneck: Measured component with the largest share.
-- @column bottleneck_share: Its share of e2e, 0..1.
-- @column queue_ttft_share: Mean queue time / mean TTFT over requests with both, 0..1.
-- @column tokenize_us_per_token: Tokenize time per prompt token over requests with both, microseconds.
-- @column per_request_tok_s: Mean per-request decode rate, tokens per second.
-- @column aggregate_tok_s: Aggregate token rate of the server(s), tokens per second.
-- @column decode_s_mean: Mean first-to-last-token time per request, seconds.
-- @column mean_concurrency: Requests in flight on average (count).
-- @column fit_basis: 'step' or 'itl': what the decode fit fitted.
-- @column fit_n: Tokens in the decode fit (count).
-- @column fit_base_ms: Decode fit intercept, milliseconds.
-- @column fit_per_1k_kv_ms: Decode fit slope per 1,000 kv tokens, milliseconds.
-- @column fit_r2: Decode fit r2, 0..1.
-- @column kv_len_min: Smallest kv_len in decode, tokens.
-- @column kv_len_max: Largest kv_len in decode, tokens.
-- @column kv_growth_pct: Fitted growth from kv_len_min to kv_len_max, percent of the fitted time at kv_len_min.
-- @column hardware_kind: 'gpu', 'cpu', 'unknown' or 'mixed'.
-- @column model_params: Largest active parameter count among traces' models (null when unknown), parameters.
-- @column roofline_available: True when the roofline was computed.
-- @column roofline_note: Why not, or what was assumed.
-- @column ideal_step_ms: Mean ideal decode step, milliseconds.
-- @column measured_step_ms: Mean measured decode step (or ITL), milliseconds.
-- @column bandwidth_efficiency: ideal / measured, 0..1.
-- @column ideal_per_1k_kv_ms: Roofline's added time per 1,000 kv tokens at the mean batch, milliseconds.
-- @column compute_to_memory: Ideal compute time / ideal memory time of a step.
-- @column host_tokens: Tokens with both ITL and step time (count).
-- @column host_mean_ms: Mean ITL minus step time, milliseconds.
-- @column host_share: Host time / ITL, 0..1.
-- @column step_mean_ms: Mean step time of decode tokens, milliseconds.
-- @column steps: Engine iterations recorded (count).
-- @column stall_ratio: Prefill-carrying step time / decode-only step time.
-- @column stalled_decode_share: Decode tokens made in steps that also prefill, 0..1.
-- @column itl_p95_ms: 95th percentile ITL (per emission), milliseconds.
-- @column tokens_per_step: Mean decode tokens a request got per forward pass (accepted tokens under speculative decoding).
-- @column step_basis: How the step accounting found each request's own passes (steps_accounting.basis).
-- @column prefill_interference_share: Decode time lost to prefill work (waits through prefill iterations plus the stretch of own passes that prefilled), share of ITL, 0..1.
-- @column prefill_wait_ms: Waits through prefill iterations, summed over requests, milliseconds.
-- @column other_decode_share: Decode time in other iterations without prefill, share of ITL, 0..1.
-- @column preempted_requests: Requests with a preemption stall (count).
-- @column preemption_stalls: Preemption stalls (count).
-- @column preempted_ms: Time preempted (no step while the engine kept stepping), summed, milliseconds.
-- @column preempted_share: Preempted time, share of decode time, 0..1.
-- @column longest_stall_ms: Longest preemption stall, milliseconds.
-- @column gpu_samples: GPU samples (count).
-- @column gpu_interval_ms: Largest median sampling interval among GPUs, milliseconds.
-- @column gpu_util_decode_pct: Mean SM (else NVML GPU) utilisation during decode, percent.
-- @column dram_bw_util_decode_pct: Mean DRAM bandwidth utilisation during decode, percent.
-- @column stacks_samples: CPU samples (count).
-- @column cpu_top_category: Busiest non-idle CPU category.
-- @column cpu_top_busy_share: Its share of non-idle samples, 0..1.
-- @column cpu_tokenize_busy_share: Tokenize share of non-idle samples, 0..1.
-- @column dropped_rows: Rows the recorder dropped (meta.json dropped_rows), summed over traces (count).
-- @column headline: Where the time went, in one sentence with its numbers.
CREATE OR REPLACE TEMP TABLE summary_numbers AS
-- One aggregate per source table (each yields exactly one row, NULLs when the source is
-- empty), cross-joined: planning ~90 scalar subqueries cost more than running them.
WITH r AS (SELECT * FROM attribution_requests WHERE ok),
cs AS (SELECT * FROM stacks_categories),
lp AS (SELECT
    first(p50_ms) FILTER (WHERE metric = 'ttft') AS ttft_p50,
    first(mean_ms) FILTER (WHERE metric = 'itl') AS itl_mean_ms,
    first(p50_ms) FILTER (WHERE metric = 'itl') AS itl_p50_ms,
    first(p95_ms) FILTER (WHERE metric = 'itl') AS itl_p95_ms,
    first(mean_ms) FILTER (WHERE metric = 'tpot') AS tpot_mean_ms
    FROM latency_percentiles),
req AS (SELECT count(*) AS requests, count(*) FILTER (WHERE NOT ok) AS failed_requests FROM attribution_requests),
rr AS (SELECT
    count(e2e_ms) AS e2e_requests,
    avg(e2e_ms) AS e2e_mean_ms,
    avg(ttft_ms) AS ttft_mean_ms,
    avg(ttft_ms) FILTER (WHERE ttft_ms IS NOT NULL AND e2e_ms IS NOT NULL)
        / nullif(avg(e2e_ms) FILTER (WHERE ttft_ms IS NOT NULL AND e2e_ms IS NOT NULL), 0) AS ttft_share,
    quantile_cont(output_tokens, 0.5) AS output_tokens_p50,
    avg(output_tokens) AS output_tokens_mean,
    avg(prompt_tokens) AS prompt_tokens_mean,
    avg(queue_ms) FILTER (WHERE queue_ms IS NOT NULL AND ttft_ms IS NOT NULL)
        / nullif(avg(ttft_ms) FILTER (WHERE queue_ms IS NOT NULL AND ttft_ms IS NOT NULL), 0) AS queue_ttft_share,
    sum(tokenize_ms) FILTER (WHERE tokenize_ms IS NOT NULL AND prompt_tokens > 0) * 1000
        / nullif(sum(prompt_tokens) FILTER (WHERE tokenize_ms IS NOT NULL AND prompt_tokens > 0), 0)
        AS tokenize_us_per_token
    FROM r),
cc AS (SELECT
    first(ms) FILTER (WHERE component = 'network') AS network_ms,
    first(share) FILTER (WHERE component = 'network') AS network_share,
    first(ms) FILTER (WHERE component = 'frontend') AS frontend_ms,
    first(share) FILTER (WHERE component = 'frontend') AS frontend_share,
    first(ms) FILTER (WHERE component = 'queue') AS queue_ms,
    first(share) FILTER (WHERE component = 'queue') AS queue_share,
    first(ms) FILTER (WHERE component = 'tokenize') AS tokenize_ms,
    first(share) FILTER (WHERE component = 'tokenize') AS tokenize_share,
    first(ms) FILTER (WHERE component = 'preprocess') AS preprocess_ms,
    first(share) FILTER (WHERE component = 'preprocess') AS preprocess_share,
    first(ms) FILTER (WHERE component = 'prefill') AS prefill_ms,
    first(share) FILTER (WHERE component = 'prefill') AS prefill_share,
    first(ms) FILTER (WHERE component = 'decode') AS decode_ms,
    first(share) FILTER (WHERE component = 'decode') AS decode_share,
    first(ms) FILTER (WHERE component = 'detokenize') AS detokenize_ms,
    first(share) FILTER (WHERE component = 'detokenize') AS detokenize_share,
    first(ms) FILTER (WHERE component = 'postprocess') AS postprocess_ms,
    first(share) FILTER (WHERE component = 'postprocess') AS postprocess_share,
    first(ms) FILTER (WHERE component = 'other') AS other_ms,
    first(share) FILTER (WHERE component = 'other') AS other_share,
    first(component) FILTER (WHERE bottleneck) AS bottleneck,
    first(share) FILTER (WHERE bottleneck) AS bottleneck_share
    FROM attribution_components),
dt AS (SELECT first(per_request_tok_s) AS per_request_tok_s, first(aggregate_tok_s) AS aggregate_tok_s,
    first(decode_s_mean) AS decode_s_mean, first(mean_concurrency) AS mean_concurrency FROM decode_throughput),
ft AS (SELECT first(basis) AS fit_basis, first(n) AS fit_n, first(base_ms) AS fit_base_ms,
    first(per_1k_kv_ms) AS fit_per_1k_kv_ms, first(r2) AS fit_r2, first(kv_len_min) AS kv_len_min,
    first(kv_len_max) AS kv_len_max,
    first(per_1k_kv_ms * (kv_len_max - kv_len_min) / 1000
          / nullif(base_ms + per_1k_kv_ms * kv_len_min / 1000, 0) * 100) AS kv_growth_pct
    FROM decode_fit WHERE level = 'all'),
rs AS (SELECT first(kind) AS hardware_kind, coalesce(first(available), false) AS roofline_available,
    first(note) AS roofline_note, first(ideal_step_ms) AS ideal_step_ms, first(measured_step_ms) AS measured_step_ms,
    first(bandwidth_efficiency) AS bandwidth_efficiency, first(ideal_per_1k_kv_ms) AS ideal_per_1k_kv_ms,
    first(compute_to_memory) AS compute_to_memory FROM roofline_summary),
ho AS (SELECT first(tokens) AS host_tokens, first(host_mean_ms) AS host_mean_ms, first(host_share) AS host_share,
    first(step_mean_ms) AS step_mean_ms FROM host_overhead),
sp AS (SELECT first(steps) AS steps, first(stall_ratio) AS stall_ratio,
    first(stalled_decode_share) AS stalled_decode_share FROM steps_prefill),
sa AS (SELECT first(tokens_per_step) AS tokens_per_step, first(basis) AS step_basis,
    first(prefill_share) AS prefill_interference_share, first(prefill_wait_ms) AS prefill_wait_ms,
    first(other_decode_share) AS other_decode_share, first(stalled_requests) AS preempted_requests,
    first(stalls) AS preemption_stalls, first(no_step_ms) AS preempted_ms, first(no_step_share) AS preempted_share,
    first(longest_stall_ms) AS longest_stall_ms FROM steps_accounting),
gd AS (SELECT coalesce(sum(samples), 0) AS gpu_samples, max(interval_ms) AS gpu_interval_ms,
    sum(coalesce(sm_util_decode_pct, gpu_util_decode_pct) * decode_samples)
        / nullif(sum(decode_samples) FILTER (WHERE coalesce(sm_util_decode_pct, gpu_util_decode_pct) IS NOT NULL), 0)
        AS gpu_util_decode_pct,
    sum(dram_bw_util_decode_pct * decode_samples)
        / nullif(sum(decode_samples) FILTER (WHERE dram_bw_util_decode_pct IS NOT NULL), 0)
        AS dram_bw_util_decode_pct
    FROM gpu_decode),
n AS (SELECT
    lp.ttft_p50,
    (SELECT count(*) FROM _traces) AS traces,
    req.requests, req.failed_requests,
    rr.e2e_requests, rr.e2e_mean_ms, rr.ttft_mean_ms, rr.ttft_share,
    lp.itl_mean_ms, lp.itl_p50_ms, lp.tpot_mean_ms,
    rr.output_tokens_p50, rr.output_tokens_mean, rr.prompt_tokens_mean,
    cc.network_ms, cc.network_share,
    cc.frontend_ms, cc.frontend_share,
    cc.queue_ms, cc.queue_share,
    cc.tokenize_ms, cc.tokenize_share,
    cc.preprocess_ms, cc.preprocess_share,
    cc.prefill_ms, cc.prefill_share,
    cc.decode_ms, cc.decode_share,
    cc.detokenize_ms, cc.detokenize_share,
    cc.postprocess_ms, cc.postprocess_share,
    cc.other_ms, cc.other_share,
    cc.bottleneck, cc.bottleneck_share,
    rr.queue_ttft_share, rr.tokenize_us_per_token,
    dt.per_request_tok_s, dt.aggregate_tok_s, dt.decode_s_mean, dt.mean_concurrency,
    ft.fit_basis, ft.fit_n, ft.fit_base_ms, ft.fit_per_1k_kv_ms, ft.fit_r2, ft.kv_len_min, ft.kv_len_max,
    ft.kv_growth_pct,
    rs.hardware_kind,
    (SELECT max(coalesce(active_params, params)) FROM _hardware) AS model_params,
    rs.roofline_available, rs.roofline_note, rs.ideal_step_ms, rs.measured_step_ms, rs.bandwidth_efficiency,
    rs.ideal_per_1k_kv_ms, rs.compute_to_memory,
    ho.host_tokens, ho.host_mean_ms, ho.host_share, ho.step_mean_ms,
    sp.steps, sp.stall_ratio, sp.stalled_decode_share,
    lp.itl_p95_ms, sa.tokens_per_step, sa.step_basis, sa.prefill_interference_share, sa.prefill_wait_ms,
    sa.other_decode_share, sa.preempted_requests, sa.preemption_stalls, sa.preempted_ms, sa.preempted_share,
    sa.longest_stall_ms,
    gd.gpu_samples, gd.gpu_interval_ms, gd.gpu_util_decode_pct, gd.dram_bw_util_decode_pct,
    (SELECT coalesce(sum(samples), 0) FROM cs) AS stacks_samples,
    (SELECT category FROM cs WHERE busy_share IS NOT NULL ORDER BY samples DESC, category LIMIT 1) AS cpu_top_category,
    (SELECT busy_share FROM cs WHERE busy_share IS NOT NULL ORDER BY samples DESC, category LIMIT 1) AS cpu_top_busy_share,
    (SELECT busy_share FROM cs WHERE category = 'tokenize') AS cpu_tokenize_busy_share,
    (SELECT coalesce(sum(dropped_rows), 0) FROM _traces) AS dropped_rows
    FROM lp, req, rr, cc, dt, ft, rs, ho, sp, sa, gd
)
SELECT * EXCLUDE (ttft_p50),
    CASE WHEN bottleneck IS NULL AND ttft_share IS NOT NULL THEN
            'no server phase is measured (a client-side trace): TTFT is ' || _pct(ttft_share) || ' of e2e (mean '
            || _ms(e2e_mean_ms) || ' over ' || _n(e2e_requests) || ' requests), first to last token the rest'
            || CASE WHEN itl_p50_ms IS NOT NULL THEN '; ITL p50 ' || _ms(itl_p50_ms) ELSE '' END
         WHEN bottleneck IS NULL THEN 'no component of e2e is measured'
         ELSE bottleneck || ' is the bottleneck: ' || _pct(bottleneck_share) || ' of e2e (mean '
              || _ms(e2e_mean_ms) || ' over ' || _n(e2e_requests) || ' requests)'
              || CASE WHEN ttft_p50 IS NOT NULL THEN '; TTFT p50 ' || _ms(ttft_p50) ELSE '' END
              || CASE WHEN itl_p50_ms IS NOT NULL THEN ', ITL p50 ' || _ms(itl_p50_ms) ELSE '' END
    END AS headline
FROM n;
