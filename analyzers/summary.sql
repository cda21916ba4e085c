-- Module summary: the key numbers of an analysis in one row, the evidence that
-- findings and claim verdicts quote. Nothing new is measured here; every column
-- is read from another module's table. The _ms/_pct/_n/_f macros format numbers
-- for the texts of findings and claims.

CREATE OR REPLACE MACRO _ms(x) AS coalesce(CASE
    WHEN abs(x) >= 1000 THEN printf('%.2f s', x / 1000)
    WHEN abs(x) >= 10 THEN printf('%.1f ms', x)
    WHEN abs(x) >= 0.1 THEN printf('%.2f ms', x)
    ELSE printf('%.1f us', x * 1000) END, '-');
CREATE OR REPLACE MACRO _pct(x) AS coalesce(CASE WHEN x > 0 AND x < 0.001 THEN printf('%.3f %%', x * 100)
    ELSE printf('%.1f %%', x * 100) END, '-');
CREATE OR REPLACE MACRO _n(x) AS coalesce(format('{:,.0f}', x::DOUBLE), '-');
CREATE OR REPLACE MACRO _f(x, d) AS coalesce(printf('%.' || d || 'f', x), '-');


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
WITH r AS (SELECT * FROM attribution_requests WHERE ok),
c AS (SELECT * FROM attribution_components),
fit AS (SELECT * FROM decode_fit WHERE level = 'all'),
cs AS (SELECT * FROM stacks_categories),
n AS (SELECT
    (SELECT p50_ms FROM latency_percentiles WHERE metric = 'ttft') AS ttft_p50,
    (SELECT count(*) FROM _traces) AS traces,
    (SELECT count(*) FROM attribution_requests) AS requests,
    (SELECT count(*) FROM attribution_requests WHERE NOT ok) AS failed_requests,
    (SELECT count(e2e_ms) FROM r) AS e2e_requests,
    (SELECT avg(e2e_ms) FROM r) AS e2e_mean_ms,
    (SELECT avg(ttft_ms) FROM r) AS ttft_mean_ms,
    (SELECT avg(ttft_ms) / nullif(avg(e2e_ms), 0) FROM r WHERE ttft_ms IS NOT NULL AND e2e_ms IS NOT NULL) AS ttft_share,
    (SELECT mean_ms FROM latency_percentiles WHERE metric = 'itl') AS itl_mean_ms,
    (SELECT p50_ms FROM latency_percentiles WHERE metric = 'itl') AS itl_p50_ms,
    (SELECT mean_ms FROM latency_percentiles WHERE metric = 'tpot') AS tpot_mean_ms,
    (SELECT quantile_cont(output_tokens, 0.5) FROM r) AS output_tokens_p50,
    (SELECT avg(output_tokens) FROM r) AS output_tokens_mean,
    (SELECT avg(prompt_tokens) FROM r) AS prompt_tokens_mean,
    (SELECT ms FROM c WHERE component = 'network') AS network_ms,
    (SELECT share FROM c WHERE component = 'network') AS network_share,
    (SELECT ms FROM c WHERE component = 'queue') AS queue_ms,
    (SELECT share FROM c WHERE component = 'queue') AS queue_share,
    (SELECT ms FROM c WHERE component = 'tokenize') AS tokenize_ms,
    (SELECT share FROM c WHERE component = 'tokenize') AS tokenize_share,
    (SELECT ms FROM c WHERE component = 'preprocess') AS preprocess_ms,
    (SELECT share FROM c WHERE component = 'preprocess') AS preprocess_share,
    (SELECT ms FROM c WHERE component = 'prefill') AS prefill_ms,
    (SELECT share FROM c WHERE component = 'prefill') AS prefill_share,
    (SELECT ms FROM c WHERE component = 'decode') AS decode_ms,
    (SELECT share FROM c WHERE component = 'decode') AS decode_share,
    (SELECT ms FROM c WHERE component = 'detokenize') AS detokenize_ms,
    (SELECT share FROM c WHERE component = 'detokenize') AS detokenize_share,
    (SELECT ms FROM c WHERE component = 'postprocess') AS postprocess_ms,
    (SELECT share FROM c WHERE component = 'postprocess') AS postprocess_share,
    (SELECT ms FROM c WHERE component = 'other') AS other_ms,
    (SELECT share FROM c WHERE component = 'other') AS other_share,
    (SELECT component FROM c WHERE bottleneck) AS bottleneck,
    (SELECT share FROM c WHERE bottleneck) AS bottleneck_share,
    (SELECT avg(queue_ms) / nullif(avg(ttft_ms), 0) FROM r WHERE queue_ms IS NOT NULL AND ttft_ms IS NOT NULL)
        AS queue_ttft_share,
    (SELECT sum(tokenize_ms) * 1000 / nullif(sum(prompt_tokens), 0) FROM r
        WHERE tokenize_ms IS NOT NULL AND prompt_tokens > 0) AS tokenize_us_per_token,
    (SELECT per_request_tok_s FROM decode_throughput) AS per_request_tok_s,
    (SELECT aggregate_tok_s FROM decode_throughput) AS aggregate_tok_s,
    (SELECT decode_s_mean FROM decode_throughput) AS decode_s_mean,
    (SELECT mean_concurrency FROM decode_throughput) AS mean_concurrency,
    (SELECT basis FROM fit) AS fit_basis,
    (SELECT n FROM fit) AS fit_n,
    (SELECT base_ms FROM fit) AS fit_base_ms,
    (SELECT per_1k_kv_ms FROM fit) AS fit_per_1k_kv_ms,
    (SELECT r2 FROM fit) AS fit_r2,
    (SELECT kv_len_min FROM fit) AS kv_len_min,
    (SELECT kv_len_max FROM fit) AS kv_len_max,
    (SELECT per_1k_kv_ms * (kv_len_max - kv_len_min) / 1000
            / nullif(base_ms + per_1k_kv_ms * kv_len_min / 1000, 0) * 100 FROM fit) AS kv_growth_pct,
    (SELECT kind FROM roofline_summary) AS hardware_kind,
    (SELECT max(coalesce(active_params, params)) FROM _hardware) AS model_params,
    coalesce((SELECT available FROM roofline_summary), false) AS roofline_available,
    (SELECT note FROM roofline_summary) AS roofline_note,
    (SELECT ideal_step_ms FROM roofline_summary) AS ideal_step_ms,
    (SELECT measured_step_ms FROM roofline_summary) AS measured_step_ms,
    (SELECT bandwidth_efficiency FROM roofline_summary) AS bandwidth_efficiency,
    (SELECT ideal_per_1k_kv_ms FROM roofline_summary) AS ideal_per_1k_kv_ms,
    (SELECT compute_to_memory FROM roofline_summary) AS compute_to_memory,
    (SELECT tokens FROM host_overhead) AS host_tokens,
    (SELECT host_mean_ms FROM host_overhead) AS host_mean_ms,
    (SELECT host_share FROM host_overhead) AS host_share,
    (SELECT step_mean_ms FROM host_overhead) AS step_mean_ms,
    (SELECT steps FROM steps_prefill) AS steps,
    (SELECT stall_ratio FROM steps_prefill) AS stall_ratio,
    (SELECT stalled_decode_share FROM steps_prefill) AS stalled_decode_share,
    (SELECT coalesce(sum(samples), 0) FROM gpu_decode) AS gpu_samples,
    (SELECT max(interval_ms) FROM gpu_decode) AS gpu_interval_ms,
    (SELECT sum(coalesce(sm_util_decode_pct, gpu_util_decode_pct) * decode_samples)
            / nullif(sum(decode_samples) FILTER (WHERE coalesce(sm_util_decode_pct, gpu_util_decode_pct) IS NOT NULL), 0)
     FROM gpu_decode) AS gpu_util_decode_pct,
    (SELECT sum(dram_bw_util_decode_pct * decode_samples)
            / nullif(sum(decode_samples) FILTER (WHERE dram_bw_util_decode_pct IS NOT NULL), 0)
     FROM gpu_decode) AS dram_bw_util_decode_pct,
    (SELECT coalesce(sum(samples), 0) FROM cs) AS stacks_samples,
    (SELECT category FROM cs WHERE busy_share IS NOT NULL ORDER BY samples DESC, category LIMIT 1) AS cpu_top_category,
    (SELECT busy_share FROM cs WHERE busy_share IS NOT NULL ORDER BY samples DESC, category LIMIT 1) AS cpu_top_busy_share,
    (SELECT busy_share FROM cs WHERE category = 'tokenize') AS cpu_tokenize_busy_share,
    (SELECT coalesce(sum(dropped_rows), 0) FROM _traces) AS dropped_rows
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
