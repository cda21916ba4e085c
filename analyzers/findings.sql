-- Module findings: what the measured numbers say, and which popular stories
-- they refute (docs/domain.md §3), including the cases where the usual rule flips.
--
-- Every finding is a condition on summary_numbers and _thresholds; a condition
-- on a number the trace did not measure is null, so the finding does not fire.
-- Each detail quotes the measured numbers. Ids are stable: docs/findings.md
-- lists them and a test keeps the two equal.

-- @table findings_catalogue
-- Every finding the analyzer can report: stable id, severity, title, and when it fires.
-- @column ordinal: Position in the catalogue (report order within a severity).
-- @column id: Stable identifier (kebab-case).
-- @column suspect: The suspect the finding is evidence about, the row of the TUI's Diagnosis panel it is shown on: a component (tracetool.schema COMPONENTS), 'replica' (one replica of several) or 'evidence' (the trace itself: what it holds, what failed, what it cannot say).
-- @column severity: 'warning' (something to act on) or 'info' (evidence, often refuting a story).
-- @column title: One-line statement of the finding.
-- @column fires_when: The condition, in words, with the thresholds it uses.
CREATE OR REPLACE TEMP TABLE findings_catalogue AS
SELECT * FROM (VALUES
    (1, 'network-dominant', 'network', 'warning', 'The network dominates latency',
        'network is the bottleneck or holds at least supported_share of e2e'),
    (2, 'network-slow-link', 'network', 'warning', 'A slow, congested or cross-region link',
        'mean network time per request is at least slow_network_ms'),
    (3, 'network-not-bottleneck', 'network', 'info', 'The network is not the bottleneck',
        'network is measured, holds less than misdiagnosis_share and is not the bottleneck'),
    (4, 'network-unmeasured', 'network', 'info', 'Network time is not measured',
        'no request has both client.request and server.request spans; the detail says which side the trace holds and the next step'),
    (5, 'short-outputs', 'network', 'warning', 'Outputs are tiny: TTFT and fixed costs dominate',
        'the median request has at most short_output_tokens output tokens'),
    (6, 'queue-dominant', 'queue', 'warning', 'Queueing dominates: the server is overloaded',
        'queue is the bottleneck, holds at least supported_share of e2e, or at least queue_ttft_share of TTFT'),
    (7, 'prefill-dominant', 'prefill', 'warning', 'Prefill dominates: long prompts',
        'prefill is the bottleneck or holds at least supported_share of e2e'),
    (8, 'pipeline-dominant', 'preprocess', 'warning', 'Pre- and post-processing dominate',
        'preprocess plus postprocess hold at least supported_share of e2e, or one is the bottleneck'),
    (9, 'tokenizer-pathological', 'tokenize', 'warning', 'The tokenizer is pathologically slow',
        'tokenize holds at least misdiagnosis_share of e2e, or costs at least tokenizer_us_per_token per prompt token '
        || 'over the requests whose prompts have at least tokenizer_min_prompt_tokens tokens'),
    (10, 'tokenizer-negligible', 'tokenize', 'info', 'Tokenizer overhead is negligible',
        'tokenize is measured, holds less than misdiagnosis_share and costs less than tokenizer_us_per_token '
        || 'per prompt token over prompts of at least tokenizer_min_prompt_tokens tokens (or there are none)'),
    (11, 'decode-dominant', 'decode', 'info', 'Decode dominates latency',
        'decode is the bottleneck'),
    (12, 'throughput-conflation', 'decode', 'info', 'Aggregate throughput is not per-request speed',
        'aggregate tok/s is at least conflation_ratio times the per-request decode rate'),
    (13, 'decode-memory-bound', 'decode', 'info', 'Decode is memory-bandwidth-bound',
        'roofline known, bandwidth efficiency at least memory_bound_efficiency and compute_to_memory below compute_bound_ratio'),
    (14, 'decode-compute-heavy', 'decode', 'warning', 'Decode steps are compute-heavy at this batch size',
        'roofline known and compute_to_memory at least compute_bound_ratio'),
    (15, 'kv-growth', 'decode', 'info', 'Decode time grows with KV length',
        'decode fit slope > 0 with r2 at least kv_growth_r2 and growth over the kv range at least kv_growth_pct'),
    (16, 'low-bandwidth-efficiency', 'decode', 'warning', 'Decode reaches little of peak memory bandwidth',
        'roofline known and bandwidth efficiency below low_bandwidth_efficiency'),
    (17, 'host-overhead', 'decode', 'warning', 'Host overhead between steps is large',
        'engine gaps (time in no iteration between a request''s emissions) are at least host_overhead_share of ITL; '
        || 'time in other requests'' iterations or preempted is not host time'),
    (18, 'small-model-or-cpu', 'decode', 'info', 'Small model or CPU: decode is not purely memory-bound',
        'hardware is a CPU, or the model has fewer than small_model_params parameters, and decode tokens exist'),
    (19, 'no-roofline', 'decode', 'info', 'No roofline for this trace',
        'model or GPU unknown, a CPU run, or no decode tokens to compare'),
    (20, 'prefill-stalls', 'decode', 'warning', 'Prefills stretch other requests'' decode steps',
        'steps that also prefill take at least prefill_stall_ratio times a decode-only step'),
    (21, 'gpu-sampling-coarse', 'evidence', 'info', 'GPU sampling is coarser than a decode step',
        'the median interval between GPU samples exceeds the mean decode step (or ITL)'),
    (22, 'gpu-underutilised', 'decode', 'warning', 'The GPU idles during decode',
        'mean SM (else NVML GPU) utilisation during decode windows is below gpu_busy_pct'),
    (23, 'cpu-tokenize-hot', 'tokenize', 'warning', 'The CPU is busy tokenizing',
        'tokenize holds at least cpu_category_share of non-idle CPU samples'),
    (24, 'cpu-profile', 'evidence', 'info', 'Where the host CPU went',
        'CPU samples exist and one non-idle category holds at least cpu_category_share of them'),
    (25, 'other-unattributed', 'other', 'warning', 'Server time outside the named phases',
        'other holds at least other_share of e2e'),
    (26, 'failed-requests', 'evidence', 'warning', 'Some requests failed',
        'at least one request has status error (left out of every figure)'),
    (27, 'dropped-rows', 'evidence', 'warning', 'The recorder dropped rows',
        'meta.json counts dropped rows: the evidence is incomplete'),
    (28, 'network-rtt-bound', 'network', 'info', 'The client''s TCP handshakes bound the network time',
        'network is not measured per request, but client.request and client.connect spans are: 1 RTT <= network <= network_bound_round_trips RTTs'),
    (29, 'prefill-interference', 'decode', 'warning', 'Co-scheduled prefill slows or pauses running decodes',
        'waits through prefill iterations plus the stretch of own steps that also prefilled hold at least '
        || 'prefill_interference_share of decode time (step accounting)'),
    (30, 'preemption', 'decode', 'warning', 'Requests were preempted mid-decode',
        'some request missed preemption_min_steps decode iterations in a row while the engine kept stepping, and '
        || 'that time holds at least preemption_share of decode time'),
    (31, 'client-bound', 'client_queue', 'warning', 'The load client, not the server, limits the run',
        'client.queue spans exist and the achieved send rate is below client_rate_ratio of the offered rate, or client_queue holds at least client_queue_share of e2e; the detail names the limit (concurrency cap, the probe''s event loop)'),
    (32, 'server-frontend', 'frontend', 'warning', 'The server''s frontend, not the network, holds the time outside the engine',
        'the server''s spans are its engine''s (server_scope engine), a TCP handshake measured the round trip, and frontend (client.request minus the engine''s span, less a round trip per request and per handshake it opened) is the bottleneck or holds at least misdiagnosis_share of e2e'),
    (33, 'network-frontend-unsplit', 'network', 'info', 'Network and the server''s own time outside its spans are not split',
        'the server says less than its whole time (its spans are its engine''s, server_scope engine, or it reported phases but no total) and no TCP handshake was timed: the client''s time beyond what the server says holds both')
) AS v(ordinal, id, suspect, severity, title, fires_when)
-- module engine: the findings from the engine's metrics; module tail_findings: the tail's
UNION ALL SELECT * FROM engine_findings_catalogue
UNION ALL SELECT * FROM tail_findings_catalogue;

-- @table findings
-- The findings that fire for this analysis, warnings first.
-- @column ordinal: Catalogue position.
-- @column id: Stable identifier (see findings_catalogue, docs/findings.md).
-- @column suspect: The suspect the finding is evidence about (see findings_catalogue).
-- @column severity: 'warning' or 'info'.
-- @column title: One-line statement.
-- @column detail: The evidence: measured numbers with units.
CREATE OR REPLACE TEMP TABLE findings AS
-- One row of every finding's detail (null when it does not fire), unnested: one projection
-- over the one-row inputs binds and optimises in a fraction of the time a UNION ALL of
-- one SELECT per finding takes.
WITH f AS (
    SELECT unnest([
    {'id': 'network-dominant', 'detail': CASE WHEN s.network_share IS NOT NULL AND (s.bottleneck = 'network' OR s.network_share >= t.supported_share)
            THEN coalesce('network ' || _ms(s.network_ms) || ' per request = ' || _pct(s.network_share) || ' of e2e (mean '
                || _ms(s.e2e_mean_ms) || '): the link, not the model, is where the time goes', '') END},
    {'id': 'network-slow-link', 'detail': CASE WHEN s.network_ms >= t.slow_network_ms
            THEN coalesce('network adds ' || _ms(s.network_ms) || ' per request (same-region RTT is 0.25-3 ms, cross-region 25-250 ms): '
                || 'a slow, congested or distant link, or new connections paying TCP and TLS round trips'
                -- a client.connect span (tracetool probe) times the TCP handshake: one RTT to whoever accepts
                || CASE WHEN c.n > 0 AND c.p50_ms * 4 < s.network_ms
                THEN '; but TCP connect took only ' || _ms(c.p50_ms) || ' (p50 of ' || c.n || '): the delay comes '
                || 'after the handshake, from a proxy or load balancer in the path, or a server that reads '
                || 'requests late (busy event loop, accept backlog)'
                WHEN c.n > 0 THEN '; TCP connect took ' || _ms(c.p50_ms) || ' (p50 of ' || c.n || '), consistent '
                || 'with a long round trip'
                ELSE '' END, '') END},
    {'id': 'network-not-bottleneck', 'detail': CASE WHEN s.network_share < t.misdiagnosis_share AND s.bottleneck <> 'network'
            THEN coalesce('network ' || _ms(s.network_ms) || ' per request = ' || _pct(s.network_share) || ' of e2e (mean '
                || _ms(s.e2e_mean_ms) || '); ' || s.bottleneck || ' holds ' || _pct(s.bottleneck_share)
                || CASE WHEN ne.basis = 'rtt-split' THEN '; network is a round trip (the shortest TCP handshake, '
                    || _ms(ne.rtt_min_ms) || ') per request and per handshake it opened'
                    || CASE WHEN s.frontend_ms IS NOT NULL THEN ', and the server''s frontend holds '
                        || _ms(s.frontend_ms) || ' per request outside its engine''s span' ELSE '' END ELSE '' END
                || ': shaving RTT will not move latency', '') END},
    {'id': 'network-unmeasured', 'detail': CASE WHEN s.network_share IS NULL AND s.e2e_requests > 0
            -- an engine's span without a handshake: network-frontend-unsplit says what is known
            AND ne.basis <> 'unsplit'
            THEN coalesce('network time is unknown (not zero): ' || CASE
                -- say what the trace holds, what it lacks, and the one step that would measure it
                WHEN ne.client_requests > 0 AND ne.server_requests = 0 THEN 'a client-side trace measures e2e, '
                    || 'TTFT and ITL, not the server''s total time (no server.request span)'
                    || CASE WHEN s.bottleneck IS NOT NULL THEN '; the server reported phases, not its total' ELSE '' END
                    || '. Next: server timing, then tracetool merge (tracetool''s middleware in a server you run; '
                    || 'tracetool receive for the OTLP spans of vLLM, TGI or SGLang)'
                WHEN ne.client_requests = 0 AND ne.server_requests > 0 THEN 'a server-side trace: no request has '
                    || 'a client.request span. Next: record the client side (tracetool probe) and tracetool merge '
                    || 'the two traces'
                WHEN ne.client_requests > 0 THEN 'client.request and server.request spans never belong to the same '
                    || 'request. Next: tracetool merge the client and server traces (it joins them on request id)'
                ELSE 'an in-process trace: the network is outside it. Next: serve the model and probe it '
                    || '(tracetool serve, tracetool probe)' END, '') END},
    {'id': 'short-outputs', 'detail': CASE WHEN s.output_tokens_p50 <= t.short_output_tokens
            THEN coalesce('median ' || _n(s.output_tokens_p50) || ' output tokens per request; TTFT ' || _ms(s.ttft_mean_ms)
                || ' = ' || _pct(s.ttft_share) || ' of e2e; '
                || CASE WHEN s.bottleneck IS NULL THEN 'first to last token the other ' || _pct(1 - s.ttft_share)
                        ELSE s.bottleneck || ' holds ' || _pct(s.bottleneck_share) END
                || ': decode is not the story here', '') END},
    {'id': 'queue-dominant', 'detail': CASE WHEN s.queue_share IS NOT NULL AND (s.bottleneck = 'queue' OR s.queue_share >= t.supported_share
            OR s.queue_ttft_share >= t.queue_ttft_share)
            THEN coalesce('queue ' || _ms(s.queue_ms) || ' per request = ' || _pct(s.queue_share) || ' of e2e and '
                || _pct(s.queue_ttft_share) || ' of TTFT (' || _ms(s.ttft_mean_ms) || '); '
                || _f(s.mean_concurrency, 1) || ' requests in flight on average', '') END},
    {'id': 'prefill-dominant', 'detail': CASE WHEN s.prefill_share IS NOT NULL AND (s.bottleneck = 'prefill' OR s.prefill_share >= t.supported_share)
            THEN coalesce('prefill ' || _ms(s.prefill_ms) || ' per request = ' || _pct(s.prefill_share) || ' of e2e; mean prompt '
                || _n(s.prompt_tokens_mean) || ' tokens, median output ' || _n(s.output_tokens_p50) || ' tokens', '') END},
    {'id': 'pipeline-dominant', 'detail': CASE WHEN (s.preprocess_share IS NOT NULL OR s.postprocess_share IS NOT NULL)
            AND (s.bottleneck IN ('preprocess', 'postprocess')
            OR coalesce(s.preprocess_share, 0) + coalesce(s.postprocess_share, 0) >= t.supported_share)
            THEN coalesce('preprocess ' || _ms(s.preprocess_ms) || ' + postprocess ' || _ms(s.postprocess_ms) || ' per request = '
                || _pct(coalesce(s.preprocess_share, 0) + coalesce(s.postprocess_share, 0))
                || ' of e2e: retrieval, reranking or guardrails outside the model', '') END},
    -- the per-token rate that can call a tokenizer slow is taken over long prompts only (k): over a
    -- few tokens, a fast tokenizer's fixed cost per call divided by the count reads as hundreds of us
    {'id': 'tokenizer-pathological', 'detail': CASE WHEN s.tokenize_share IS NOT NULL AND (s.tokenize_share >= t.misdiagnosis_share
            OR k.us_per_token >= t.tokenizer_us_per_token)
            THEN coalesce('tokenize ' || _ms(s.tokenize_ms) || ' per request = ' || _pct(s.tokenize_share) || ' of e2e'
                -- (_f and _n print '–' for null: test for null before formatting)
                || CASE WHEN k.us_per_token IS NOT NULL THEN ', ' || _f(k.us_per_token, 1) || ' µs per prompt token over '
                        || _n(k.n) || ' requests with prompts of ' || _n(t.tokenizer_min_prompt_tokens) || '+ tokens'
                    WHEN s.tokenize_us_per_token IS NOT NULL THEN ', ' || _f(s.tokenize_us_per_token, 1)
                        || ' µs per prompt token'
                    ELSE '' END
                || ' (fast tokenizers: about 1 µs): a pure-Python tokenizer, huge inputs or a catastrophic regex', '') END},
    {'id': 'tokenizer-negligible', 'detail': CASE WHEN s.tokenize_share < t.misdiagnosis_share
            AND coalesce(k.us_per_token < t.tokenizer_us_per_token, true)
            THEN coalesce('tokenize ' || _ms(s.tokenize_ms) || ' per request = ' || _pct(s.tokenize_share) || ' of e2e'
                || coalesce(' (' || _f(s.tokenize_us_per_token, 2) || ' µs per prompt token'
                    || CASE WHEN s.tokenize_us_per_token < t.tokenizer_us_per_token THEN ''
                        WHEN k.us_per_token IS NULL THEN '; prompts average ' || _f(s.prompt_tokens_mean, 1)
                            || ' tokens, so that is the fixed cost of a call spread over a few tokens, '
                            || 'not a slow tokenizer'
                        ELSE '; ' || _f(k.us_per_token, 2) || ' us over prompts of ' || _n(t.tokenizer_min_prompt_tokens)
                            || '+ tokens: the rest is the fixed cost of a call on short prompts' END
                    || ')', ''), '') END},
    {'id': 'decode-dominant', 'detail': CASE WHEN s.bottleneck = 'decode'
            THEN coalesce('decode ' || _ms(s.decode_ms) || ' per request = ' || _pct(s.decode_share) || ' of e2e: '
                || _n(s.output_tokens_mean) || ' output tokens at ' || _ms(s.itl_mean_ms) || ' ITL. Levers: '
                || 'speculative decoding, GQA/MQA/MLA, fp8 KV cache, shorter outputs, batching policy', '') END},
    {'id': 'throughput-conflation', 'detail': CASE WHEN s.aggregate_tok_s >= t.conflation_ratio * s.per_request_tok_s
            THEN coalesce('aggregate ' || _n(s.aggregate_tok_s) || ' tok/s across ' || _f(s.mean_concurrency, 1)
                || ' requests in flight on average, but each request decodes at ' || _f(s.per_request_tok_s, 1)
                || ' tok/s (TPOT ' || _ms(s.tpot_mean_ms) || '): a ' || _n(s.output_tokens_mean)
                || '-token answer takes ' || _f(s.decode_s_mean, 2) || ' s of decode', '') END},
    {'id': 'decode-memory-bound', 'detail': CASE WHEN s.roofline_available AND s.bandwidth_efficiency >= t.memory_bound_efficiency
            AND s.compute_to_memory < t.compute_bound_ratio
            THEN coalesce('measured step ' || _ms(s.measured_step_ms) || ' vs ' || _ms(s.ideal_step_ms)
                || ' ideal to stream weights and KV cache = ' || _pct(s.bandwidth_efficiency)
                || ' of peak bandwidth; compute would take ' || _f(s.compute_to_memory, 2)
                || 'x the memory time: more FLOPs will not move ITL', '') END},
    {'id': 'decode-compute-heavy', 'detail': CASE WHEN s.roofline_available AND s.compute_to_memory >= t.compute_bound_ratio
            THEN coalesce('at this batch size a step needs ' || _f(s.compute_to_memory, 2)
                || 'x as long for its FLOPs as for its bytes (ideal memory time ' || _ms(s.ideal_step_ms)
                || '): the step has crossed to the compute side of the roofline', '') END},
    {'id': 'kv-growth', 'detail': CASE WHEN s.fit_per_1k_kv_ms > 0 AND s.fit_r2 >= t.kv_growth_r2 AND s.kv_growth_pct >= t.kv_growth_pct
            THEN coalesce(s.fit_basis || ' time = ' || _ms(s.fit_base_ms) || ' + ' || _f(s.fit_per_1k_kv_ms, 3)
                || ' ms per 1k KV tokens (r2 ' || _f(s.fit_r2, 2) || ', ' || _n(s.fit_n)
                || CASE WHEN s.fit_basis = 'batch-step' THEN ' decode iterations, KV summed over the batch' ELSE ' tokens' END
                || '): +'
                || _f(s.kv_growth_pct, 0) || ' % from kv_len ' || _n(s.kv_len_min) || ' to ' || _n(s.kv_len_max)
                || coalesce('; the roofline predicts ' || _f(s.ideal_per_1k_kv_ms, 3) || ' ms per 1k', ''), '') END},
    {'id': 'low-bandwidth-efficiency', 'detail': CASE WHEN s.roofline_available AND s.bandwidth_efficiency < t.low_bandwidth_efficiency
            THEN coalesce('measured step ' || _ms(s.measured_step_ms) || ' vs ' || _ms(s.ideal_step_ms) || ' ideal = '
                || _pct(s.bandwidth_efficiency) || ' of peak bandwidth (55-85 % is typical at batch 1): host '
                || 'overhead, launch-bound kernels, tensor-parallel communication, or wrong model/GPU inputs', '') END},
    {'id': 'host-overhead', 'detail': CASE WHEN s.host_share >= t.host_overhead_share
            THEN coalesce('each token spends ' || _ms(s.host_mean_ms) || ' outside the forward pass = ' || _pct(s.host_share)
                || ' of its ITL (step ' || _ms(s.step_mean_ms) || ', ' || _n(s.host_tokens)
                || ' tokens): scheduling, sampling, detokenize, Python'
                || CASE WHEN ho.waited_mean_ms > 0 THEN '; not counted: ' || _ms(ho.waited_mean_ms)
                    || ' per token in other requests'' iterations or preempted (scheduling, not host time)' ELSE '' END,
                '') END},
    {'id': 'small-model-or-cpu', 'detail': CASE WHEN (s.hardware_kind = 'cpu' OR s.model_params < t.small_model_params) AND s.fit_n > 0
            THEN coalesce(CASE WHEN s.hardware_kind = 'cpu' THEN 'a CPU run'
                WHEN s.model_params < 1e9 THEN 'a small model (' || _f(s.model_params / 1e6, 1) || 'M parameters)'
                ELSE 'a small model (' || _f(s.model_params / 1e9, 2) || 'B parameters)' END
                || ': the KV cache is small and compute plus Python host overhead per step are comparable to '
                || 'memory traffic' || coalesce(' (host ' || _ms(s.host_mean_ms) || ' of ' || _ms(s.host_mean_ms / s.host_share)
                || ' per token)', '') || '; decode is not purely memory-bound', '') END},
    {'id': 'no-roofline', 'detail': CASE WHEN NOT s.roofline_available
            THEN coalesce(coalesce(s.roofline_note, 'model or hardware unknown'), '') END},
    {'id': 'prefill-stalls', 'detail': CASE WHEN s.stall_ratio >= t.prefill_stall_ratio AND s.stalled_decode_share > 0
            THEN coalesce('steps that also prefill take ' || _f(s.stall_ratio, 1) || 'x a decode-only step; '
                || _pct(s.stalled_decode_share) || ' of decode tokens waited on them (chunked prefill or a '
                || 'prefill budget per step would cap this)', '') END},
    {'id': 'gpu-sampling-coarse', 'detail': CASE WHEN s.gpu_interval_ms > coalesce(s.step_mean_ms, s.measured_step_ms, s.itl_mean_ms)
            THEN coalesce('GPU sampled every ' || _ms(s.gpu_interval_ms) || ' but a decode step takes '
                || _ms(coalesce(s.step_mean_ms, s.measured_step_ms, s.itl_mean_ms)) || ': each sample averages about '
                || _f(s.gpu_interval_ms / coalesce(s.step_mean_ms, s.measured_step_ms, s.itl_mean_ms), 0) || ' steps', '') END},
    {'id': 'gpu-underutilised', 'detail': CASE WHEN s.gpu_util_decode_pct < t.gpu_busy_pct
            THEN coalesce('GPU utilisation ' || _f(s.gpu_util_decode_pct, 0) || ' % during decode windows'
                || coalesce(' (DRAM bandwidth ' || _f(s.dram_bw_util_decode_pct, 0) || ' %)', '')
                || ': the GPU waits on the host between kernels or steps', '') END},
    {'id': 'cpu-tokenize-hot', 'detail': CASE WHEN s.cpu_tokenize_busy_share >= t.cpu_category_share
            THEN coalesce('tokenize holds ' || _pct(s.cpu_tokenize_busy_share) || ' of non-idle CPU samples ('
                || _n(s.stacks_samples) || ' samples)', '') END},
    {'id': 'cpu-profile', 'detail': CASE WHEN s.cpu_top_busy_share >= t.cpu_category_share
            THEN coalesce(s.cpu_top_category || ' holds ' || _pct(s.cpu_top_busy_share) || ' of non-idle CPU samples ('
                || _n(s.stacks_samples) || ' samples)', '') END},
    {'id': 'other-unattributed', 'detail': CASE WHEN s.other_share >= t.other_share
            THEN coalesce('other ' || _ms(s.other_ms) || ' per request = ' || _pct(s.other_share) || ' of e2e: server time '
                || CASE WHEN ne.server_requests = 0 AND ne.basis = 'rtt-split'
                    -- a server that reported phases but not its total (llama.cpp's timings)
                    THEN 'outside the phases it reported (it gave no total): waiting for a slot or a batch, HTTP '
                        || 'handling, chat template, tokenization, streaming; the network, a round trip per request, '
                        || 'is not in it'
                        || CASE WHEN ew.waiting_max >= t.engine_waiting_requests THEN '. The engine''s own metrics '
                            || 'show up to ' || _n(ew.waiting_max) || ' requests waiting (' || ew.series
                            || '): much of it is the wait for a slot, which the server''s timings leave out' ELSE '' END
                    ELSE 'in no named phase; add spans for the missing phase' END, '') END},
    {'id': 'failed-requests', 'detail': CASE WHEN s.failed_requests > 0
            THEN coalesce(_n(s.failed_requests) || ' of ' || _n(s.requests) || ' requests failed; they are left out of every figure', '') END},
    {'id': 'dropped-rows', 'detail': CASE WHEN s.dropped_rows > 0
            THEN coalesce(_n(s.dropped_rows) || ' rows were dropped while recording (buffers full): figures cover what was kept', '') END},
    {'id': 'network-rtt-bound', 'detail': CASE WHEN ne.basis = 'tcp-connect'
            THEN coalesce('network is not measured per request, but the TCP handshake takes ' || _ms(ne.rtt_ms)
                || ' (' || CASE WHEN ne.connections = 1 THEN 'one new connection'
                              ELSE 'median of ' || _n(ne.connections) || ' new connections' END
                || ', one round trip each): network >= RTT '
                || _ms(ne.rtt_ms) || ' = ' || _pct(ne.rtt_share) || ' of e2e (mean ' || _ms(ne.e2e_mean_ms) || '); '
                || CASE ne.verdict
                    WHEN 'misdiagnosis' THEN 'even ' || _n(ne.round_trips) || ' round trips would be '
                        || _pct(ne.bound_share) || ' of e2e: the network is not the story'
                    WHEN 'supported' THEN 'one round trip alone is a large share: the link matters here'
                    ELSE _n(ne.round_trips) || ' round trips would be ' || _pct(ne.bound_share)
                        || ' of e2e: the network may matter; measure it with server timing' END
                || ' (a proxy that accepts connections and then waits would hide behind a short handshake)', '') END},
    {'id': 'server-frontend', 'detail': CASE WHEN ne.basis = 'rtt-split' AND s.frontend_share IS NOT NULL
            AND (s.bottleneck = 'frontend' OR s.frontend_share >= t.misdiagnosis_share)
            THEN coalesce('the server spent ' || _ms(s.frontend_ms) || ' per request = ' || _pct(s.frontend_share)
                || ' of e2e outside its engine''s span (HTTP handling, chat template, tokenization before the engine, '
                || 'detokenization and streaming after), against a network of ' || _ms(s.network_ms)
                || ' (TCP handshake ' || _ms(ne.rtt_min_ms) || ', ' || CASE WHEN ne.connections = 1 THEN 'one connection'
                    ELSE 'the shortest of ' || _n(ne.connections) || ' connections' END
                || '): this is server time, not the network; it grows when the API server shares its CPU with the '
                || 'engine (vLLM: more API server processes, a faster tokenizer, shorter chat templates)', '') END},
    {'id': 'network-frontend-unsplit', 'detail': CASE WHEN ne.basis = 'unsplit'
            THEN coalesce('the client''s time beyond what the server says it spent (' || CASE WHEN s.frontend_share IS NULL
                    AND ne.server_requests = 0 THEN 'its reported phases' ELSE 'its engine''s span' END || ') is '
                || _ms(ne.outside_ms) || ' per request = ' || _pct(ne.outside_share) || ' of e2e (mean '
                || _ms(ne.e2e_mean_ms) || '): the network plus server time (HTTP, chat template, tokenization, '
                || 'waiting, detokenization, streaming), not split: no round trip was measured. '
                || CASE WHEN ne.verdict = 'misdiagnosis' THEN 'Even all of it would be a small share: the network is '
                    || 'not the story. ' ELSE '' END
                || 'Next: probe with tracetool probe, which times each new connection''s TCP handshake', '') END},
    {'id': 'prefill-interference', 'detail': CASE WHEN s.prefill_interference_share >= t.prefill_interference_share
            THEN coalesce('co-scheduled prefill costs ' || _pct(s.prefill_interference_share) || ' of decode time ('
                || _ms(s.prefill_wait_ms) || ' in all waiting through prefill iterations'
                || CASE WHEN s.itl_p50_ms > 0 THEN '; ITL p95 ' || _ms(s.itl_p95_ms) || ' = ' || _f(s.itl_p95_ms / s.itl_p50_ms, 1)
                    || 'x the p50 ' || _ms(s.itl_p50_ms) ELSE '' END
                || '): cap the prefill work per step (vLLM --enable-chunked-prefill with a smaller '
                || 'max_num_batched_tokens, SGLang --chunked-prefill-size) or disaggregate prefill', '') END},
    {'id': 'preemption', 'detail': CASE WHEN s.preempted_requests > 0 AND s.preempted_share >= t.preemption_share
            THEN coalesce(_n(s.preempted_requests) || ' requests were preempted (' || _n(s.preemption_stalls) || ' stalls): '
                || _ms(s.preempted_ms) || ' with no step while the engine kept stepping = ' || _pct(s.preempted_share)
                || ' of decode time (longest ' || _ms(s.longest_stall_ms) || '): the KV cache ran out of room; give it '
                || 'more memory (vLLM --gpu-memory-utilization), admit fewer sequences (--max-num-seqs) or shorter outputs', '') END},
    -- offered and achieved rates come from the client.queue spans: start = intended send, end = sent
    {'id': 'client-bound', 'detail': CASE WHEN cq.n > 0 AND (cq.achieved_rps < t.client_rate_ratio * cq.offered_rps
            OR cqs.share >= t.client_queue_share)
            THEN coalesce('the load client, not the server, sets the pace: '
                || CASE WHEN cq.offered_rps IS NOT NULL THEN 'it sent ' || _f(cq.achieved_rps, 2) || ' requests/s of the '
                    || _f(cq.offered_rps, 2) || ' offered (' || _pct(cq.achieved_rps / cq.offered_rps) || '); ' ELSE '' END
                || 'requests waited ' || _ms(coalesce(cqs.ms, 0)) || ' each in the client after their intended send time = '
                || _pct(coalesce(cqs.share, 0)) || ' of e2e. Limit: '
                || CASE WHEN lag.n > 0 AND lag.total_ms >= 0.5 * cq.queue_total_ms
                    THEN 'the probe''s own event loop (' || _n(lag.n) || ' stalls over 1 ms, worst ' || _ms(lag.max_ms)
                        || '): drive fewer requests/s per probe process, or run several'
                    ELSE 'the concurrency cap (at most ' || _n(fl.peak) || ' requests in flight while others waited): '
                        || 'raise --concurrency to move the wait into the server''s queue, where it is the server''s' END, '') END}
    ], recursive := true)
    FROM summary_numbers AS s, _thresholds AS t, network_evidence AS ne, host_overhead AS ho,
        (SELECT sum(n) AS n, sum(queue_total_ms) AS queue_total_ms,
                arg_min(offered_rps, achieved_rps / offered_rps) AS offered_rps,
                arg_min(achieved_rps, achieved_rps / offered_rps) AS achieved_rps
         FROM (SELECT count(*) AS n, sum(end_ns - start_ns) / 1e6 AS queue_total_ms,
                      (count(*) - 1) * 1e9 / nullif(max(start_ns) - min(start_ns), 0) AS offered_rps,
                      (count(*) - 1) * 1e9 / nullif(max(end_ns) - min(end_ns), 0) AS achieved_rps
               FROM spans WHERE name = 'client.queue' GROUP BY trace)) AS cq,
        (SELECT ms, share FROM attribution_components WHERE component = 'client_queue') AS cqs,
        (SELECT count(*) AS n, coalesce(sum(end_ns - start_ns), 0) / 1e6 AS total_ms,
                max(end_ns - start_ns) / 1e6 AS max_ms
         FROM spans WHERE name = 'client.loop_lag') AS lag,
        -- the most client.request spans in flight at once (ends sort before starts at a tie)
        (SELECT max(c) AS peak FROM (SELECT sum(d) OVER (PARTITION BY trace ORDER BY ts, d
                                                        ROWS UNBOUNDED PRECEDING) AS c
         FROM (SELECT trace, start_ns AS ts, 1 AS d FROM spans WHERE name = 'client.request'
               UNION ALL SELECT trace, end_ns, -1 FROM spans WHERE name = 'client.request'))) AS fl,
        (SELECT count(*) AS n, median((end_ns - start_ns) / 1e6) AS p50_ms
         FROM spans WHERE name = 'client.connect') AS c,
        -- the engine's own waiting gauge, where one trace holds engine metrics
        (SELECT max(e.requests_waiting_max) AS waiting_max,
                max(st.series) FILTER (WHERE st.concept = 'requests_waiting') AS series
         FROM engine_summary AS e LEFT JOIN engine_stats AS st USING (trace)
         WHERE (SELECT count(*) FROM engine_summary) = 1) AS ew,
        (SELECT count(*) AS n, sum(r.tokenize_ms) * 1000 / nullif(sum(r.prompt_tokens), 0) AS us_per_token
         FROM attribution_requests AS r, _thresholds AS tk
         WHERE r.ok AND r.tokenize_ms IS NOT NULL AND r.prompt_tokens >= tk.tokenizer_min_prompt_tokens) AS k
)
SELECT c.ordinal, f.id, c.suspect, c.severity, c.title, f.detail
FROM (SELECT id, detail FROM f UNION ALL SELECT id, detail FROM engine_findings
      UNION ALL SELECT id, detail FROM tail_findings) AS f
JOIN findings_catalogue AS c USING (id)
WHERE f.detail IS NOT NULL
ORDER BY c.severity = 'warning' DESC, c.ordinal;
