-- Module roofline: decode against the memory-bandwidth roofline (docs/domain.md §1).
--
-- A decode step streams the weights and the batch's KV cache from HBM, so its
-- ideal time is (weight_bytes + batch x kv_len x kv_bytes_per_token) /
-- (mem_bw_bytes_per_s x gpu_count); bandwidth efficiency = ideal / measured.
-- Inputs per trace come from _hardware (meta.json model/hardware blocks, or the
-- --model/--gpu presets). CPU traces and traces with unknown hardware or model
-- get no roofline; `note` says why. Failed requests are left out.
--
-- On the batch-step basis (decode_fit: batched traces with a steps table) the
-- comparison is per decode-only iteration: ideal = (weights read at its batch size
-- + its summed kv_tokens x kv_bytes_per_token) / (bandwidth x GPUs), measured = its
-- time. MoE models (experts, experts_per_token) read the dense weights plus the
-- experts the batch routes to: of B sequences each taking top-k of E experts, an
-- expert is touched with probability 1 - (1 - k/E)^B per layer, so a large batch
-- streams nearly every expert, not only the active parameters (docs/domain.md §6).

-- Weight bytes one decode step reads at batch size b: weight_bytes holds k/E of the
-- routed experts (one token's read); swap that for the expected share touched by b sequences.
CREATE OR REPLACE MACRO _moe_weight_bytes(w, eb, e, k, b) AS
    w + coalesce(eb * ((1 - pow(1 - k / e, greatest(b, 1))) - k / e), 0);

-- The distinct non-null strings of a list, sorted and joined (string_agg(DISTINCT ... ORDER BY)
-- without the DISTINCT aggregate, which DuckDB plans as extra group-bys and joins).
CREATE OR REPLACE MACRO _join_distinct(l, sep) AS
    CASE WHEN len(list_distinct(l)) > 0 THEN array_to_string(list_sort(list_distinct(l)), sep) END;

-- @table roofline_summary
-- One row: the roofline over every decode token of traces whose model and GPU are known.
-- @column available: True when at least one trace had the model, the GPU and decode tokens.
-- @column kind: 'gpu', 'cpu', 'unknown' or 'mixed' (traces disagree).
-- @column model: Model name(s).
-- @column gpu: GPU name(s).
-- @column gpu_count: GPUs the weights are sharded over (tensor parallel), largest among traces.
-- @column source: Where the inputs came from ('meta.json', '--model', '--gpu', joined with +).
-- @column note: Why the roofline is missing or what was assumed; null when nothing to say.
-- @column weight_bytes: Weight bytes one token's decode step reads (MoE: the active parameters), all GPUs together, bytes.
-- @column kv_bytes_per_token: KV-cache bytes per token of context, bytes.
-- @column mem_bw_bytes_per_s: Peak memory bandwidth per GPU, bytes per second.
-- @column peak_flops: Peak dense FLOP/s per GPU at the weights' dtype, FLOP per second.
-- @column basis: 'batch-step' (measured = decode-only iteration time), 'step' (measured = a token's forward-pass time) or 'itl' (measured = server-side gap per emission).
-- @column tokens: Decode tokens compared (count; decode-only iterations on the batch-step basis).
-- @column kv_len_mean: Mean kv_len of those tokens, tokens.
-- @column batch_mean: Mean batch size of those tokens, sequences (1 when not recorded).
-- @column ideal_base_ms: Ideal time to read the weights once (MoE: the experts touched at each step's batch size), mean over what was compared, milliseconds.
-- @column ideal_per_1k_kv_ms: Ideal added time per 1,000 tokens of kv_len at the mean batch (batch-step: per 1,000 KV tokens summed over the batch), milliseconds.
-- @column ideal_step_ms: Mean ideal step time over the tokens, milliseconds.
-- @column measured_step_ms: Mean measured step time (or ITL) over the tokens, milliseconds.
-- @column bandwidth_efficiency: ideal_step_ms / measured_step_ms, 0..1 (above 1 means the inputs overstate the bytes).
-- @column achieved_bw_bytes_per_s: Bytes the ideal model moves divided by measured time, per GPU, bytes per second.
-- @column compute_step_ms: Ideal compute time of a step: 2 x active params x mean batch / (peak_flops x gpu_count), milliseconds.
-- @column compute_to_memory: compute_step_ms / ideal_step_ms: below 1 the step sits on the memory side of the roofline.
CREATE OR REPLACE TEMP TABLE roofline_summary AS
WITH basis AS (SELECT coalesce(any_value(basis), 'step') AS b FROM decode_fit WHERE level = 'all'),
st AS (
    SELECT s.trace, count(*) AS n, sum(s.dur_ns) / 1e6 AS ms, sum(s.kv_tokens) AS kv, sum(s.batch_size) AS bsum,
        sum(_moe_weight_bytes(h.weight_bytes, h.expert_bytes, h.experts, h.experts_per_token, s.batch_size)) AS wsum
    FROM _steps_seq AS s JOIN _hardware AS h USING (trace)
    WHERE s.prefill_tokens = 0 AND s.decode_tokens > 0 AND s.kv_tokens IS NOT NULL
    GROUP BY s.trace
),
req AS (
    SELECT t.trace,
        CASE WHEN b = 'step' THEN t.fit_n ELSE t.roof_itl_tokens END AS ideal_n,
        CASE WHEN b = 'step' THEN t.roof_kv_tokens ELSE t.roof_itl_kv_tokens END AS kv_tokens,
        t.fit_n, t.fit_sy, t.fit_sx, t.batch_mean, t.decode_tokens
    FROM tokens_requests AS t
    CROSS JOIN basis
    WHERE NOT t.failed
),
per_trace AS (
    SELECT h.*,
        coalesce(sum(r.ideal_n), 0) AS ideal_n, coalesce(sum(r.kv_tokens), 0) AS kv_tokens,
        coalesce(sum(r.fit_n), 0) AS step_n, coalesce(sum(r.fit_sy), 0) AS step_ms, coalesce(sum(r.fit_sx), 0) AS step_kv,
        sum(r.batch_mean * r.decode_tokens) / nullif(sum(r.decode_tokens) FILTER (WHERE r.batch_mean IS NOT NULL), 0)
            AS batch_mean,
        h.kind = 'gpu' AND h.weight_bytes IS NOT NULL AND h.kv_bytes_per_token IS NOT NULL
            AND h.mem_bw_bytes_per_s > 0 AS complete
    FROM _hardware AS h
    LEFT JOIN req AS r USING (trace)
    GROUP BY ALL
),
-- The ITL basis is measured over every trace together (tokens_gap_stats is one row):
-- with it, per-trace measured sums are apportioned by token counts.
meas0 AS (
    -- EXCLUDE and the three again, not REPLACE: --engine spark translates EXCLUDE, and Spark has no REPLACE
    SELECT p.* EXCLUDE (ideal_n, kv_tokens, batch_mean),
        CASE WHEN b = 'batch-step' THEN coalesce(st.n, 0) ELSE p.ideal_n END AS ideal_n,
        CASE WHEN b = 'batch-step' THEN coalesce(st.kv, 0) ELSE p.kv_tokens END AS kv_tokens,
        CASE WHEN b = 'batch-step' THEN st.bsum / nullif(st.n, 0) ELSE p.batch_mean END AS batch_mean,
        CASE WHEN b = 'batch-step' THEN coalesce(st.n, 0) WHEN b = 'step' THEN p.step_n ELSE p.ideal_n END AS meas_n,
        CASE WHEN b = 'batch-step' THEN st.ms WHEN b = 'step' THEN p.step_ms
             ELSE g.itl_fit_sy / nullif(g.itl_fit_n, 0) * p.ideal_n END AS meas_ms,
        -- kv_len_mean: per sequence (the batch-step basis sums KV tokens over the batch)
        CASE WHEN b = 'batch-step' THEN st.kv / nullif(st.bsum, 0) * st.n WHEN b = 'step' THEN p.step_kv
             ELSE g.itl_fit_sx / nullif(g.itl_fit_n, 0) * p.ideal_n END AS kv_sum,
        st.wsum
    FROM per_trace AS p CROSS JOIN basis CROSS JOIN tokens_gap_stats AS g LEFT JOIN st USING (trace)
),
meas AS (
    SELECT *,
        CASE WHEN b = 'batch-step' THEN wsum
             ELSE ideal_n * _moe_weight_bytes(weight_bytes, expert_bytes, experts, experts_per_token,
                                             coalesce(batch_mean, 1)) END AS weight_sum
    FROM meas0, basis
),
use AS (
    SELECT *,
        (weight_sum + kv_tokens * kv_bytes_per_token)
            / (mem_bw_bytes_per_s * gpu_count) * 1000 AS ideal_sum_ms,
        2 * coalesce(active_params, params) * coalesce(batch_mean, 1) / (peak_flops * gpu_count) * 1000
            AS compute_ms
    FROM meas
    WHERE complete AND ideal_n > 0 AND meas_n > 0
),
agg AS (
    SELECT
        count(*) AS n_traces,
        sum(ideal_n) AS ideal_n, sum(meas_n) AS meas_n,
        sum(ideal_sum_ms) / sum(ideal_n) AS ideal_step_ms,
        sum(meas_ms) / sum(meas_n) AS measured_step_ms,
        sum(kv_sum) / sum(meas_n) AS kv_len_mean,
        coalesce(sum(batch_mean * ideal_n) / nullif(sum(ideal_n) FILTER (WHERE batch_mean IS NOT NULL), 0), 1)
            AS batch_mean,
        sum(compute_ms * ideal_n) / nullif(sum(ideal_n) FILTER (WHERE compute_ms IS NOT NULL), 0) AS compute_step_ms,
        sum(weight_sum / (mem_bw_bytes_per_s * gpu_count) * 1000) / sum(ideal_n) AS ideal_base_ms,
        sum(kv_bytes_per_token / (mem_bw_bytes_per_s * gpu_count) * 1000 * 1000 * ideal_n) / sum(ideal_n)
            AS ideal_per_1k_kv_b1_ms,
        sum(mem_bw_bytes_per_s * ideal_n) / sum(ideal_n) AS bw
    FROM use
)
SELECT
    coalesce(agg.n_traces, 0) > 0 AS available,
    CASE WHEN min(p.kind) = max(p.kind) THEN min(p.kind) ELSE 'mixed' END AS kind,
    _join_distinct(list(p.model), ', ') AS model,
    _join_distinct(list(p.gpu), ', ') AS gpu,
    max(p.gpu_count)::BIGINT AS gpu_count,
    _join_distinct(list(p.source), ', ') AS source,
    CASE WHEN coalesce(agg.n_traces, 0) = 0 AND bool_and(p.complete) THEN 'no decode tokens to compare'
         ELSE _join_distinct(list(p.note), '; ') END AS note,
    CASE WHEN min(p.weight_bytes) = max(p.weight_bytes) THEN min(p.weight_bytes) END AS weight_bytes,
    CASE WHEN min(p.kv_bytes_per_token) = max(p.kv_bytes_per_token) THEN min(p.kv_bytes_per_token) END AS kv_bytes_per_token,
    CASE WHEN min(p.mem_bw_bytes_per_s) = max(p.mem_bw_bytes_per_s) THEN min(p.mem_bw_bytes_per_s) END AS mem_bw_bytes_per_s,
    CASE WHEN min(p.peak_flops) = max(p.peak_flops) THEN min(p.peak_flops) END AS peak_flops,
    (SELECT b FROM basis) AS basis,
    coalesce(any_value(agg.meas_n), 0)::BIGINT AS tokens,
    any_value(agg.kv_len_mean) AS kv_len_mean,
    any_value(agg.batch_mean) AS batch_mean,
    any_value(agg.ideal_base_ms) AS ideal_base_ms,
    -- the batch-step fit's slope is per 1,000 KV tokens summed over the batch: compare like with like
    any_value(agg.ideal_per_1k_kv_b1_ms * CASE WHEN (SELECT b FROM basis) = 'batch-step' THEN 1 ELSE agg.batch_mean END)
        AS ideal_per_1k_kv_ms,
    any_value(agg.ideal_step_ms) AS ideal_step_ms,
    any_value(agg.measured_step_ms) AS measured_step_ms,
    any_value(agg.ideal_step_ms / nullif(agg.measured_step_ms, 0)) AS bandwidth_efficiency,
    any_value(agg.ideal_step_ms / nullif(agg.measured_step_ms, 0) * agg.bw) AS achieved_bw_bytes_per_s,
    any_value(agg.compute_step_ms) AS compute_step_ms,
    any_value(agg.compute_step_ms / nullif(agg.ideal_step_ms, 0)) AS compute_to_memory
FROM per_trace AS p
CROSS JOIN agg
GROUP BY agg.n_traces;

-- @view roofline_tokens
-- One row per decode token with a measured time: measured against ideal, for
-- plots of ITL over kv_len with the roofline beside it. Null ideal when the
-- trace's model or GPU is unknown. Reads tokens in order: for one request filter on request_key.
-- @column trace: Trace label.
-- @column request_id: Request id.
-- @column request_key: Integer key of the request.
-- @column index: Token index (>= 1).
-- @column kv_len: Context length of the forward pass, tokens.
-- @column batch_size: Sequences in the batch (null when not recorded).
-- @column measured_ms: Step time where recorded, else server-side ITL, milliseconds.
-- @column ideal_ms: (weight bytes at this batch size + batch x kv_len x kv_bytes_per_token) / (bandwidth x GPUs), milliseconds.
CREATE OR REPLACE VIEW roofline_tokens AS
SELECT g.trace, g.request_id, g.request_key, g.index, g.kv_len, g.batch_size,
    coalesce(g.step_ms, g.server_itl_ms) AS measured_ms,
    CASE WHEN h.kind = 'gpu' AND h.mem_bw_bytes_per_s > 0 THEN
        (_moe_weight_bytes(h.weight_bytes, h.expert_bytes, h.experts, h.experts_per_token, coalesce(g.batch_size, 1))
            + coalesce(g.batch_size, 1) * g.kv_len * h.kv_bytes_per_token)
        / (h.mem_bw_bytes_per_s * h.gpu_count) * 1000 END AS ideal_ms
FROM tokens_gaps AS g
JOIN _hardware AS h USING (trace);
