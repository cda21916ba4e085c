-- Module engine: the serving engine's own state over the run, from the Prometheus samples
-- tracetool scraped from its /metrics (table server_metrics, docs/trace-format.md).
--
-- One mapping (engine_names) puts each engine's series onto common concepts: requests
-- waiting and running, KV-cache usage, preemptions, prefix-cache queries and hits, and
-- queue / prefill / decode / tokenize time. Series no mapping knows are kept as scraped:
-- engine_series lists every one, and server_metrics holds their samples for the SQL console.
--
-- The measured window of a trace is the first start to the last end of its request spans on
-- the metrics' clock (client.request when the probe scraped, server.request when the
-- recording process did); when the metrics' clock is another host's, the scrapes' own span.
-- A trace whose samples are on several clocks (a merged trace: the probe's scrapes and the
-- server's recording process's) is read on one of them, the first of client, server,
-- scraper that has request spans (else the first present): two scrapers of one engine
-- would count it twice.
-- Gauges are averaged (and their maximum taken) over the scrapes inside the window. Counters
-- and histogram series stay raw in the trace: their deltas are taken here, from the last
-- scrape at or before the window's start (the scraper reads one before the first request, so
-- a warm-up or earlier traffic never counts) to the first scrape at or after its end (the
-- scraper reads one when the run ends), else the nearest inside; a counter that went down
-- (an engine restart) counts from zero. Time histograms give a mean
-- (delta of _sum over delta of _count) and p50/p95 from the bucket increases, never more
-- precise than the buckets allow: each percentile has an upper bound, the bucket's upper edge
-- or, when lower, what the sum and count allow (_engine_quantiles), and its estimate is
-- Prometheus's histogram_quantile interpolation capped at that bound. Where several label
-- sets carry one concept (several models or data-parallel engines) counts and times add up;
-- usage ratios are averaged.

-- @table engine_names
-- The name mapping: which exported series stands for which concept, per engine, from each
-- engine's documented metrics (docs/serving.md lists them).
-- @column engine: vllm, sglang, tgi, llamacpp, trtllm or dynamo.
-- @column concept: requests_waiting, requests_running, kv_cache_usage, preemptions, prefix_cache_queries, prefix_cache_hits, prefix_cache_hit_rate, queue_time, prefill_time, decode_time, tokenize_time, inference_time, ttft or itl.
-- @column name: The series name as exported (a histogram's, without _bucket/_sum/_count).
-- @column kind: gauge, counter or histogram.
-- @column preference: Order among the names of one concept (1 first): a newer name before its older one, an engine's own series before a frontend's.
CREATE OR REPLACE TEMP TABLE engine_names AS
SELECT * FROM (VALUES
    ('vllm', 'requests_running', 'vllm:num_requests_running', 'gauge', 1),
    ('vllm', 'requests_waiting', 'vllm:num_requests_waiting', 'gauge', 1),
    ('vllm', 'kv_cache_usage', 'vllm:kv_cache_usage_perc', 'gauge', 1),
    ('vllm', 'kv_cache_usage', 'vllm:gpu_cache_usage_perc', 'gauge', 2),
    ('vllm', 'preemptions', 'vllm:num_preemptions_total', 'counter', 1),
    ('vllm', 'prefix_cache_queries', 'vllm:prefix_cache_queries_total', 'counter', 1),
    ('vllm', 'prefix_cache_queries', 'vllm:gpu_prefix_cache_queries_total', 'counter', 2),
    ('vllm', 'prefix_cache_hits', 'vllm:prefix_cache_hits_total', 'counter', 1),
    ('vllm', 'prefix_cache_hits', 'vllm:gpu_prefix_cache_hits_total', 'counter', 2),
    ('vllm', 'prefix_cache_hit_rate', 'vllm:gpu_prefix_cache_hit_rate', 'gauge', 2),
    ('vllm', 'queue_time', 'vllm:request_queue_time_seconds', 'histogram', 1),
    ('vllm', 'prefill_time', 'vllm:request_prefill_time_seconds', 'histogram', 1),
    ('vllm', 'decode_time', 'vllm:request_decode_time_seconds', 'histogram', 1),
    ('vllm', 'inference_time', 'vllm:request_inference_time_seconds', 'histogram', 1),
    ('vllm', 'ttft', 'vllm:time_to_first_token_seconds', 'histogram', 1),
    ('vllm', 'itl', 'vllm:inter_token_latency_seconds', 'histogram', 1),
    ('vllm', 'itl', 'vllm:time_per_output_token_seconds', 'histogram', 2),
    ('sglang', 'requests_running', 'sglang:num_running_reqs', 'gauge', 1),
    ('sglang', 'requests_waiting', 'sglang:num_queue_reqs', 'gauge', 1),
    ('sglang', 'kv_cache_usage', 'sglang:token_usage', 'gauge', 1),
    ('sglang', 'prefix_cache_hit_rate', 'sglang:cache_hit_rate', 'gauge', 1),
    ('sglang', 'queue_time', 'sglang:queue_time_seconds', 'histogram', 1),
    ('sglang', 'ttft', 'sglang:time_to_first_token_seconds', 'histogram', 1),
    ('sglang', 'itl', 'sglang:inter_token_latency_seconds', 'histogram', 1),
    ('tgi', 'requests_waiting', 'tgi_queue_size', 'gauge', 1),
    ('tgi', 'requests_running', 'tgi_batch_current_size', 'gauge', 1),
    ('tgi', 'queue_time', 'tgi_request_queue_duration', 'histogram', 1),
    ('tgi', 'tokenize_time', 'tgi_request_validation_duration', 'histogram', 1),
    ('tgi', 'inference_time', 'tgi_request_inference_duration', 'histogram', 1),
    ('tgi', 'itl', 'tgi_request_mean_time_per_token_duration', 'histogram', 1),
    ('llamacpp', 'requests_running', 'llamacpp:requests_processing', 'gauge', 1),
    ('llamacpp', 'requests_waiting', 'llamacpp:requests_deferred', 'gauge', 1),
    ('llamacpp', 'kv_cache_usage', 'llamacpp:kv_cache_usage_ratio', 'gauge', 1),
    ('trtllm', 'queue_time', 'trtllm_request_queue_time_seconds', 'histogram', 1),
    ('trtllm', 'ttft', 'trtllm_time_to_first_token_seconds', 'histogram', 1),
    ('trtllm', 'itl', 'trtllm_time_per_output_token_seconds', 'histogram', 1),
    ('dynamo', 'requests_waiting', 'dynamo_frontend_queued_requests', 'gauge', 3),
    ('dynamo', 'ttft', 'dynamo_frontend_time_to_first_token_seconds', 'histogram', 3),
    ('dynamo', 'itl', 'dynamo_frontend_inter_token_latency_seconds', 'histogram', 3)
) AS v(engine, concept, name, kind, preference);

-- Each mapped name as exported: as documented, and with ':' as '_' (how some OpenMetrics
-- expositions spell names with colons).
CREATE OR REPLACE VIEW _engine_names_all AS
SELECT engine, concept, name, kind, preference FROM engine_names
UNION ALL
SELECT engine, concept, replace(name, ':', '_'), kind, preference FROM engine_names WHERE name LIKE '%:%';

-- @view engine_series
-- Every series scraped (mapped or not), with the concept it stands for: the way into series
-- no mapping knows (their samples are in server_metrics).
-- @column trace: Trace label.
-- @column clock: The clock of the samples' timestamps: client, server or scraper (a series scraped on two clocks has a row for each).
-- @column name: Sample name as exported.
-- @column labels: Labels, a JSON object.
-- @column engine: The engine whose mapping knows the series; null for an unknown series.
-- @column concept: The concept it maps to (see engine_names); null for an unknown series.
-- @column part: bucket, sum or count for a histogram's series; null otherwise.
-- @column samples: Scrapes that carried the series.
-- @column first_ns: First scrape carrying it, nanoseconds on the metrics' clock.
-- @column last_ns: Last scrape carrying it, nanoseconds on the metrics' clock.
CREATE OR REPLACE VIEW engine_series AS
SELECT m.trace, coalesce(m.clock, 'client') AS clock, m.name, m.labels, n.engine, n.concept, m.part,
    count(*) AS samples, min(m.ts_ns) AS first_ns, max(m.ts_ns) AS last_ns
FROM (SELECT *, CASE WHEN name LIKE '%\_bucket' ESCAPE '\' THEN 'bucket'
                     WHEN name LIKE '%\_sum' ESCAPE '\' THEN 'sum'
                     WHEN name LIKE '%\_count' ESCAPE '\' THEN 'count' END AS part
      FROM server_metrics) AS m
LEFT JOIN _engine_names_all AS n
    ON n.name = m.name OR (n.kind = 'histogram' AND m.part IS NOT NULL
        AND m.name = n.name || '_' || m.part)
GROUP BY ALL;

-- @table engine_window
-- The measured window of each trace with engine metrics, on the metrics' clock (one per trace:
-- see the module's header for the clock read when the samples are on several).
-- @column trace: Trace label.
-- @column clock: The clock of the scrapes' timestamps: client, server or scraper.
-- @column start_ns: Window start, nanoseconds: the first request's start (or the first scrape).
-- @column end_ns: Window end, nanoseconds: the last request's end (or the last scrape).
-- @column basis: requests (request spans on the same clock) or scrapes (no request on that clock).
-- @column scrapes: Scrapes inside the window.
CREATE OR REPLACE TEMP TABLE engine_window AS
WITH m AS (
    SELECT trace, coalesce(clock, 'client') AS clock, min(ts_ns) AS first_ns, max(ts_ns) AS last_ns
    FROM server_metrics GROUP BY ALL
), r AS (
    SELECT trace, clock, min(start_ns) AS start_ns, max(end_ns) AS end_ns
    FROM spans
    WHERE (clock = 'client' AND name = 'client.request') OR (clock = 'server' AND name = 'server.request')
    GROUP BY trace, clock
), w AS (
    SELECT m.trace, m.clock, coalesce(r.start_ns, m.first_ns) AS start_ns, coalesce(r.end_ns, m.last_ns) AS end_ns,
        CASE WHEN r.start_ns IS NULL THEN 'scrapes' ELSE 'requests' END AS basis,
        row_number() OVER (PARTITION BY m.trace ORDER BY r.start_ns IS NULL,
                           CASE m.clock WHEN 'client' THEN 1 WHEN 'server' THEN 2 WHEN 'scraper' THEN 3 ELSE 4 END,
                           m.clock) AS pick
    FROM m LEFT JOIN r ON r.trace = m.trace AND r.clock = m.clock
)
SELECT w.trace, w.clock, w.start_ns, w.end_ns, w.basis,
    (SELECT count(DISTINCT s.ts_ns) FROM server_metrics AS s
     WHERE s.trace = w.trace AND coalesce(s.clock, 'client') = w.clock
         AND s.ts_ns BETWEEN w.start_ns AND w.end_ns) AS scrapes
FROM w WHERE w.pick = 1;

-- Per trace and concept, the one series name used (the best preference present on the window's clock).
CREATE OR REPLACE TEMP TABLE _engine_pick AS
SELECT trace, concept, arg_min(engine, preference) AS engine, arg_min(base, preference) AS name,
    arg_min(kind, preference) AS kind
FROM (SELECT DISTINCT s.trace, s.concept, s.engine, n.name AS base, n.kind, n.preference
      FROM engine_series AS s
      JOIN engine_window AS w ON w.trace = s.trace AND w.clock = s.clock
      JOIN _engine_names_all AS n ON n.engine = s.engine AND n.concept = s.concept
          AND (s.name = n.name OR s.name = n.name || '_' || s.part))
GROUP BY trace, concept;

-- The mapped samples of the picked series, with the histogram part and bucket bound.
CREATE OR REPLACE VIEW _engine_samples AS
SELECT m.trace, p.concept, p.kind, m.ts_ns, m.labels, m.value,
    CASE WHEN m.name = p.name THEN NULL ELSE substr(m.name, length(p.name) + 2) END AS part,
    CASE WHEN m.name = p.name || '_bucket'
        -- a labels string that is not JSON (a third party's trace) gives no bound, not an error
        AND json_valid(m.labels)
        THEN try_cast(replace(json_extract_string(m.labels, '$.le'), '+Inf', 'inf') AS DOUBLE) END AS le
FROM server_metrics AS m
JOIN engine_window AS w ON w.trace = m.trace AND w.clock = coalesce(m.clock, 'client')
JOIN _engine_pick AS p ON p.trace = m.trace
    AND (m.name = p.name OR (p.kind = 'histogram' AND m.name IN (p.name || '_bucket', p.name || '_sum',
                                                                   p.name || '_count')));

-- @view engine_timeline
-- The engine's state at each scrape: what the TUI draws beside the request timeline.
-- @column trace: Trace label.
-- @column ts_ns: Scrape time, nanoseconds on the metrics' clock.
-- @column requests_waiting: Requests waiting (summed over label sets); null when not exported.
-- @column requests_running: Requests running (summed over label sets); null when not exported.
-- @column kv_cache_usage: KV-cache usage, fraction 0-1 (averaged over label sets); null when not exported.
-- @column preemptions: The engine's preemption counter as scraped (summed over label sets; counts since the engine started, so read its increase), count; null when not exported.
CREATE OR REPLACE VIEW engine_timeline AS
SELECT trace, ts_ns,
    sum(value) FILTER (WHERE concept = 'requests_waiting' AND kind = 'gauge') AS requests_waiting,
    sum(value) FILTER (WHERE concept = 'requests_running' AND kind = 'gauge') AS requests_running,
    avg(value) FILTER (WHERE concept = 'kv_cache_usage' AND kind = 'gauge') AS kv_cache_usage,
    sum(value) FILTER (WHERE concept = 'preemptions' AND kind = 'counter') AS preemptions
FROM _engine_samples
WHERE kind = 'gauge' OR (kind = 'counter' AND concept = 'preemptions')
GROUP BY trace, ts_ns;

-- Per series (concept, labels, part), its value at the scrapes that bracket the window.
CREATE OR REPLACE TEMP TABLE _engine_deltas AS
SELECT s.trace, s.concept, s.labels, s.part, s.le,
    coalesce(arg_min(s.value, s.ts_ns) FILTER (WHERE s.ts_ns >= w.end_ns), arg_max(s.value, s.ts_ns)) AS v_end,
    coalesce(arg_max(s.value, s.ts_ns) FILTER (WHERE s.ts_ns <= w.start_ns), arg_min(s.value, s.ts_ns)) AS v_start,
    bool_or(s.ts_ns <= w.start_ns) AS has_baseline
FROM _engine_samples AS s JOIN engine_window AS w USING (trace)
WHERE s.kind IN ('counter', 'histogram')
GROUP BY ALL;

-- A counter's or histogram series' increase over the window (a reset counts from zero).
CREATE OR REPLACE VIEW _engine_increase AS
SELECT trace, concept, labels, part, le, has_baseline,
    CASE WHEN v_end >= v_start THEN v_end - v_start ELSE v_end END AS delta
FROM _engine_deltas;

-- Bucket increases summed over label sets, cumulative by bound (as exported); per bucket its lower
-- edge (0 below the first bound), its own observations, and those of the buckets above it: how
-- many, and their least possible sum (each at its bucket's lower edge).
CREATE OR REPLACE VIEW _engine_buckets AS
WITH b AS (
    SELECT trace, concept, le, sum(delta) AS cum,
        lag(le) OVER (PARTITION BY trace, concept ORDER BY le) AS prev_le,
        lag(sum(delta)) OVER (PARTITION BY trace, concept ORDER BY le) AS prev_cum,
        max(sum(delta)) OVER (PARTITION BY trace, concept) AS total
    FROM _engine_increase
    WHERE part = 'bucket' AND le IS NOT NULL
    GROUP BY trace, concept, le
), e AS (
    SELECT *, coalesce(prev_le, least(le, 0.0)) AS lo, cum - coalesce(prev_cum, 0) AS n_in FROM b
)
SELECT *, total - cum AS n_above,
    coalesce(sum(lo * n_in) OVER (PARTITION BY trace, concept ORDER BY le
                                  ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING), 0) AS above_min_sum
FROM e;

-- The q-quantile of each histogram. It lies in the first bucket (lo, le] whose cumulative count
-- reaches q x total. Its upper bound: le, and what the sum S and count n allow. At least
-- (1 - q) n observations are at or above it: the n_above ones in higher buckets are each at
-- least their bucket's lower edge, the others at least the quantile itself, and none is below
-- zero, so quantile <= (S - above_min_sum) / ((1 - q) n - n_above) when that denominator is
-- positive (a vLLM at low load: 24 queue times summing to 0.72 ms, all in (0, 0.3 s], have a
-- median of at most 0.06 ms, where interpolating inside the bucket said 150 ms). The estimate
-- is histogram_quantile's linear interpolation inside the bucket (its lower edge in the +Inf
-- bucket), capped at the bound, never below the bucket's lower edge; null where there is no
-- finite bucket to interpolate in.
CREATE OR REPLACE VIEW _engine_quantiles AS
WITH k AS (
    -- the bucket the quantile falls in (the first whose cumulative count reaches q x total)
    SELECT trace, concept, q,
        arg_min(CASE WHEN isinf(le) THEN prev_le
                     ELSE lo + (le - lo) * (q * total - coalesce(prev_cum, 0)) / nullif(n_in, 0) END, le) AS interpolated,
        arg_min(lo, le) AS bucket_lo, min(le) AS bucket_hi, arg_min(n_above, le) AS bucket_n_above,
        arg_min(above_min_sum, le) AS bucket_above_min_sum
    FROM _engine_buckets, (SELECT 0.5 AS q UNION ALL SELECT 0.95)
    WHERE total > 0 AND cum >= q * total
    GROUP BY trace, concept, q
), sc AS (
    SELECT trace, concept, sum(delta) FILTER (WHERE part = 'sum') AS s, sum(delta) FILTER (WHERE part = 'count') AS n
    FROM _engine_increase GROUP BY trace, concept
), b AS (
    SELECT k.*, CASE WHEN (1 - k.q) * sc.n - k.bucket_n_above > 0
                     THEN (sc.s - k.bucket_above_min_sum) / ((1 - k.q) * sc.n - k.bucket_n_above) END AS sum_bound
    FROM k LEFT JOIN sc ON sc.trace = k.trace AND sc.concept = k.concept
), m AS (
    -- (greatest and least skip nulls: every argument below is known)
    SELECT *, CASE WHEN sum_bound IS NULL THEN (CASE WHEN NOT isinf(bucket_hi) THEN bucket_hi END)
                   WHEN isinf(bucket_hi) THEN greatest(bucket_lo, sum_bound)
                   ELSE greatest(bucket_lo, least(bucket_hi, sum_bound)) END AS bound
    FROM b
)
SELECT trace, concept, q,
    CASE WHEN interpolated IS NULL OR bound IS NULL THEN interpolated
         ELSE greatest(bucket_lo, least(interpolated, bound)) END AS value,
    bound AS value_max
FROM m;

-- @table engine_stats
-- One row per trace and mapped concept: the window aggregate the analysis reports.
-- @column trace: Trace label.
-- @column concept: The concept (see engine_names).
-- @column engine: The engine whose series gave it.
-- @column series: The series used (a histogram's name without _bucket/_sum/_count): the evidence a finding cites.
-- @column kind: gauge, counter or histogram.
-- @column samples: Gauge samples inside the window (gauges); histogram observations in the window (histograms); null for counters.
-- @column mean: Gauges: mean over the window's scrapes; histograms: mean observation (delta sum / delta count), the series' unit (seconds); null for counters.
-- @column max: Gauges: maximum over the window's scrapes; null otherwise.
-- @column delta: Counters: increase over the window; histograms: observations in the window; null for gauges.
-- @column p50: Histograms: median estimated from the bucket increases (interpolated inside its bucket, capped at p50_max), the series' unit; null otherwise, or when it falls in the +Inf bucket with no finite bound below.
-- @column p95: Histograms: 95th percentile estimated from the bucket increases (capped at p95_max); null otherwise.
-- @column p50_max: Histograms: upper bound of the median that the buckets, the sum and the count allow, the series' unit; null when nothing bounds it.
-- @column p95_max: Histograms: upper bound of the 95th percentile that the buckets, the sum and the count allow; null when nothing bounds it.
-- @column baseline: Whether a scrape at or before the window's start was the baseline of the deltas (false: the first scrape inside the window was, and earlier observations in the window are missed).
CREATE OR REPLACE TEMP TABLE engine_stats AS
WITH g AS (
    SELECT t.trace, c.concept, avg(c.v) AS mean, max(c.v) AS max, count(*) AS samples
    FROM engine_window AS t
    JOIN (SELECT trace, concept, ts_ns,
              CASE WHEN concept IN ('kv_cache_usage', 'prefix_cache_hit_rate') THEN avg(value) ELSE sum(value) END AS v
          FROM _engine_samples WHERE kind = 'gauge' GROUP BY trace, concept, ts_ns) AS c
        ON c.trace = t.trace AND c.ts_ns BETWEEN t.start_ns AND t.end_ns
    GROUP BY t.trace, c.concept
), d AS (
    SELECT trace, concept,
        sum(delta) FILTER (WHERE part IS NULL) AS counter_delta,
        sum(delta) FILTER (WHERE part = 'sum') AS sum_delta,
        sum(delta) FILTER (WHERE part = 'count') AS count_delta,
        bool_and(has_baseline) AS baseline
    FROM _engine_increase GROUP BY trace, concept
)
SELECT p.trace, p.concept, p.engine, p.name AS series, p.kind,
    CASE WHEN p.kind = 'gauge' THEN g.samples WHEN p.kind = 'histogram' THEN d.count_delta::BIGINT END AS samples,
    CASE WHEN p.kind = 'gauge' THEN g.mean WHEN p.kind = 'histogram' THEN d.sum_delta / nullif(d.count_delta, 0) END AS mean,
    CASE WHEN p.kind = 'gauge' THEN g.max END AS max,
    CASE WHEN p.kind = 'counter' THEN d.counter_delta WHEN p.kind = 'histogram' THEN d.count_delta END AS delta,
    q50.value AS p50, q95.value AS p95, q50.value_max AS p50_max, q95.value_max AS p95_max,
    d.baseline
FROM _engine_pick AS p
LEFT JOIN g ON g.trace = p.trace AND g.concept = p.concept
LEFT JOIN d ON d.trace = p.trace AND d.concept = p.concept
LEFT JOIN _engine_quantiles AS q50 ON q50.trace = p.trace AND q50.concept = p.concept AND q50.q = 0.5
LEFT JOIN _engine_quantiles AS q95 ON q95.trace = p.trace AND q95.concept = p.concept AND q95.q = 0.95;

-- @table engine_summary
-- One row per trace with engine metrics: the engine's state over the measured window.
-- @column trace: Trace label.
-- @column source: The engine(s) whose series were mapped, comma-separated (e.g. vllm); null when no series is known.
-- @column clock: The clock of the scrapes: client, server or scraper.
-- @column window_s: Length of the measured window, seconds.
-- @column scrapes: Scrapes inside the window.
-- @column series: Distinct series scraped (mapped or not) on the window's clock.
-- @column requests_waiting_mean: Mean requests waiting over the window's scrapes.
-- @column requests_waiting_max: Most requests waiting at one scrape.
-- @column requests_running_mean: Mean requests running over the window's scrapes.
-- @column requests_running_max: Most requests running at one scrape.
-- @column kv_cache_usage_mean: Mean KV-cache usage, fraction 0-1.
-- @column kv_cache_usage_max: Highest KV-cache usage at one scrape, fraction 0-1.
-- @column preemptions: Preemptions counted in the window; null when the engine exports no such counter.
-- @column prefix_cache_hit_rate: Prefix-cache hits / queries in the window, else the engine's own hit-rate gauge averaged, fraction 0-1; null when neither is exported or nothing was queried.
-- @column queue_time_ms_mean: Mean time requests spent waiting, milliseconds (histogram sum/count deltas).
-- @column queue_time_ms_p50: Median queue time estimated from buckets (interpolated, capped at queue_time_ms_p50_max), milliseconds.
-- @column queue_time_ms_p95: 95th percentile queue time estimated from buckets (capped at queue_time_ms_p95_max), milliseconds.
-- @column queue_time_ms_p50_max: Upper bound of the median queue time that the buckets, sum and count allow, milliseconds (the median is at most this).
-- @column queue_time_ms_p95_max: Upper bound of the 95th percentile queue time that the buckets, sum and count allow, milliseconds.
-- @column queue_time_n: Requests the queue-time histogram observed in the window.
-- @column prefill_time_ms_mean: Mean prefill time, milliseconds.
-- @column prefill_time_ms_p50: Median prefill time estimated from buckets (capped at prefill_time_ms_p50_max), milliseconds.
-- @column prefill_time_ms_p95: 95th percentile prefill time estimated from buckets (capped at prefill_time_ms_p95_max), milliseconds.
-- @column prefill_time_ms_p50_max: Upper bound of the median prefill time that the buckets, sum and count allow, milliseconds (the median is at most this).
-- @column prefill_time_ms_p95_max: Upper bound of the 95th percentile prefill time that the buckets, sum and count allow, milliseconds.
-- @column prefill_time_n: Requests the prefill-time histogram observed in the window.
-- @column decode_time_ms_mean: Mean decode time, milliseconds.
-- @column decode_time_ms_p50: Median decode time estimated from buckets (capped at decode_time_ms_p50_max), milliseconds.
-- @column decode_time_ms_p95: 95th percentile decode time estimated from buckets (capped at decode_time_ms_p95_max), milliseconds.
-- @column decode_time_ms_p50_max: Upper bound of the median decode time that the buckets, sum and count allow, milliseconds (the median is at most this).
-- @column decode_time_ms_p95_max: Upper bound of the 95th percentile decode time that the buckets, sum and count allow, milliseconds.
-- @column decode_time_n: Requests the decode-time histogram observed in the window.
-- @column tokenize_time_ms_mean: Mean tokenization (TGI: validation) time, milliseconds.
-- @column tokenize_time_ms_p50: Median tokenization time estimated from buckets (capped at tokenize_time_ms_p50_max), milliseconds.
-- @column tokenize_time_ms_p95: 95th percentile tokenization time estimated from buckets (capped at tokenize_time_ms_p95_max), milliseconds.
-- @column tokenize_time_ms_p50_max: Upper bound of the median tokenization time that the buckets, sum and count allow, milliseconds (the median is at most this).
-- @column tokenize_time_ms_p95_max: Upper bound of the 95th percentile tokenization time that the buckets, sum and count allow, milliseconds.
-- @column tokenize_time_n: Requests the tokenize-time histogram observed in the window.
-- @column baseline: Whether every delta had a scrape at or before the window's start as its baseline.
CREATE OR REPLACE TEMP TABLE engine_summary AS
WITH s AS (SELECT * FROM engine_stats),
x AS (
    SELECT trace,
        string_agg(DISTINCT engine, ',' ORDER BY engine) AS source,
        any_value(mean) FILTER (WHERE concept = 'requests_waiting') AS requests_waiting_mean,
        any_value(max) FILTER (WHERE concept = 'requests_waiting') AS requests_waiting_max,
        any_value(mean) FILTER (WHERE concept = 'requests_running') AS requests_running_mean,
        any_value(max) FILTER (WHERE concept = 'requests_running') AS requests_running_max,
        any_value(mean) FILTER (WHERE concept = 'kv_cache_usage') AS kv_cache_usage_mean,
        any_value(max) FILTER (WHERE concept = 'kv_cache_usage') AS kv_cache_usage_max,
        any_value(delta) FILTER (WHERE concept = 'preemptions') AS preemptions,
        coalesce(any_value(delta) FILTER (WHERE concept = 'prefix_cache_hits')
                     / nullif(any_value(delta) FILTER (WHERE concept = 'prefix_cache_queries'), 0),
                 any_value(mean) FILTER (WHERE concept = 'prefix_cache_hit_rate')) AS prefix_cache_hit_rate,
        any_value(mean * 1000) FILTER (WHERE concept = 'queue_time') AS queue_time_ms_mean,
        any_value(p50 * 1000) FILTER (WHERE concept = 'queue_time') AS queue_time_ms_p50,
        any_value(p95 * 1000) FILTER (WHERE concept = 'queue_time') AS queue_time_ms_p95,
        any_value(p50_max * 1000) FILTER (WHERE concept = 'queue_time') AS queue_time_ms_p50_max,
        any_value(p95_max * 1000) FILTER (WHERE concept = 'queue_time') AS queue_time_ms_p95_max,
        any_value(samples) FILTER (WHERE concept = 'queue_time') AS queue_time_n,
        any_value(mean * 1000) FILTER (WHERE concept = 'prefill_time') AS prefill_time_ms_mean,
        any_value(p50 * 1000) FILTER (WHERE concept = 'prefill_time') AS prefill_time_ms_p50,
        any_value(p95 * 1000) FILTER (WHERE concept = 'prefill_time') AS prefill_time_ms_p95,
        any_value(p50_max * 1000) FILTER (WHERE concept = 'prefill_time') AS prefill_time_ms_p50_max,
        any_value(p95_max * 1000) FILTER (WHERE concept = 'prefill_time') AS prefill_time_ms_p95_max,
        any_value(samples) FILTER (WHERE concept = 'prefill_time') AS prefill_time_n,
        any_value(mean * 1000) FILTER (WHERE concept = 'decode_time') AS decode_time_ms_mean,
        any_value(p50 * 1000) FILTER (WHERE concept = 'decode_time') AS decode_time_ms_p50,
        any_value(p95 * 1000) FILTER (WHERE concept = 'decode_time') AS decode_time_ms_p95,
        any_value(p50_max * 1000) FILTER (WHERE concept = 'decode_time') AS decode_time_ms_p50_max,
        any_value(p95_max * 1000) FILTER (WHERE concept = 'decode_time') AS decode_time_ms_p95_max,
        any_value(samples) FILTER (WHERE concept = 'decode_time') AS decode_time_n,
        any_value(mean * 1000) FILTER (WHERE concept = 'tokenize_time') AS tokenize_time_ms_mean,
        any_value(p50 * 1000) FILTER (WHERE concept = 'tokenize_time') AS tokenize_time_ms_p50,
        any_value(p95 * 1000) FILTER (WHERE concept = 'tokenize_time') AS tokenize_time_ms_p95,
        any_value(p50_max * 1000) FILTER (WHERE concept = 'tokenize_time') AS tokenize_time_ms_p50_max,
        any_value(p95_max * 1000) FILTER (WHERE concept = 'tokenize_time') AS tokenize_time_ms_p95_max,
        any_value(samples) FILTER (WHERE concept = 'tokenize_time') AS tokenize_time_n,
        coalesce(bool_and(baseline), true) AS baseline
    FROM s GROUP BY trace
)
SELECT w.trace, x.source, w.clock, (w.end_ns - w.start_ns) / 1e9 AS window_s, w.scrapes,
    (SELECT count(*) FROM (SELECT DISTINCT name, labels FROM server_metrics AS m
                           WHERE m.trace = w.trace AND coalesce(m.clock, 'client') = w.clock)) AS series,
    x.* EXCLUDE (trace, source, baseline), coalesce(x.baseline, true) AS baseline
FROM engine_window AS w LEFT JOIN x USING (trace);

-- @table engine_headline
-- One row when no server component is measured per request but the engine's time histograms give
-- some (a client trace with scraped metrics): the analysis's headline, told from the engine's window
-- means with their basis, so that the text report says what the JSON's engine-metrics components say.
-- @column component: The component with the largest window mean (not a per-request bottleneck).
-- @column share: Its window mean over mean e2e, 0..1.
-- @column headline: Where the time went by the engine's own metrics, in one sentence with its numbers and basis.
CREATE OR REPLACE TEMP TABLE engine_headline AS
WITH e AS (
    SELECT * FROM engine_summary WHERE (SELECT count(*) FROM engine_summary) = 1
), s AS (
    SELECT e2e_mean_ms, e2e_requests, ttft_share, itl_p50_ms FROM summary_numbers WHERE bottleneck IS NULL
), c AS (
    SELECT x.* FROM (
        SELECT 1 AS ord, 'queue' AS component, queue_time_ms_mean AS ms, queue_time_n AS n FROM e
        UNION ALL SELECT 2, 'tokenize', tokenize_time_ms_mean, tokenize_time_n FROM e
        UNION ALL SELECT 3, 'prefill', prefill_time_ms_mean, prefill_time_n FROM e
        UNION ALL SELECT 4, 'decode', decode_time_ms_mean, decode_time_n FROM e) AS x
    WHERE x.ms IS NOT NULL
        AND x.component NOT IN (SELECT component FROM attribution_components WHERE measured)
)
SELECT arg_max(c.component, c.ms) AS component, max(c.ms) / max(s.e2e_mean_ms) AS share,
    'no server phase is measured per request; the engine''s own metrics (' || max(e.source)
        || ', means over the window) put ' || string_agg(c.component || ' at ' || _ms(c.ms) || ' = '
            || _pct(c.ms / s.e2e_mean_ms), ', ' ORDER BY c.ms DESC, c.ord)
        || ' of mean e2e (' || _ms(max(s.e2e_mean_ms)) || ' over ' || _n(max(s.e2e_requests)) || ' requests)'
        || coalesce('; TTFT is ' || _pct(max(s.ttft_share)) || ' of e2e', '')
        || coalesce(', ITL p50 ' || _ms(max(s.itl_p50_ms)), '') AS headline
FROM c, s, e
WHERE s.e2e_mean_ms > 0
HAVING count(*) > 0;

-- @table engine_findings_catalogue
-- The findings engine metrics can report (appended to findings_catalogue).
-- @column ordinal: Position in the catalogue (after the findings of module findings).
-- @column id: Stable identifier (kebab-case).
-- @column suspect: The suspect the finding is evidence about, the row of the TUI's Diagnosis panel it is shown on: a component (tracetool.schema COMPONENTS), 'replica' (one replica of several) or 'evidence' (the trace itself: what it holds, what failed, what it cannot say).
-- @column severity: 'warning' or 'info'.
-- @column title: One-line statement of the finding.
-- @column fires_when: The condition, in words, with the thresholds it uses.
CREATE OR REPLACE TEMP TABLE engine_findings_catalogue AS
SELECT * FROM (VALUES
    (101, 'engine-queueing', 'queue', 'warning', 'The engine''s own metrics show requests queueing',
        'at some scrape at least engine_waiting_requests requests waited, and the engine''s mean queue time is at least queue_ttft_share of mean TTFT (or no queue-time histogram is exported)'),
    (102, 'engine-no-queueing', 'queue', 'info', 'The engine''s metrics refute the queueing story',
        'no scrape saw engine_waiting_requests requests waiting, and the engine''s mean queue time (when exported) is below misdiagnosis_share of mean TTFT'),
    (103, 'engine-kv-pressure', 'decode', 'warning', 'The KV cache filled up and the engine preempted requests',
        'KV-cache usage reached kv_cache_full at some scrape and the preemption counter rose in the window'),
    (104, 'engine-prefix-cache-misses', 'prefill', 'warning', 'Long prompts mostly miss the prefix cache',
        'prefix-cache hit rate below prefix_cache_hit_rate_low while prompts average at least prefix_cache_prompt_tokens tokens')
) AS v(ordinal, id, suspect, severity, title, fires_when);

-- @view engine_findings
-- The engine findings that fire: each detail quotes the numbers and cites the series it used.
-- @column id: Stable identifier (see engine_findings_catalogue, docs/findings.md).
-- @column detail: The evidence: measured numbers with units and the series they came from.
CREATE OR REPLACE VIEW engine_findings AS
WITH e AS (
    -- one trace with engine metrics (a combined analysis of several: none, each trace has its own)
    SELECT * FROM engine_summary WHERE (SELECT count(*) FROM engine_summary) = 1
), c AS (
    SELECT concept, series FROM engine_stats WHERE (SELECT count(*) FROM engine_summary) = 1
), lat AS (
    SELECT avg(ttft_ms) FILTER (WHERE ok) AS ttft_ms, avg(prompt_tokens) FILTER (WHERE ok) AS prompt_tokens
    FROM attribution_requests
), itl AS (
    SELECT any_value(p50_ms) FILTER (WHERE metric = 'itl') AS p50_ms, any_value(p99_ms) FILTER (WHERE metric = 'itl') AS p99_ms
    FROM latency_percentiles
)
SELECT id, detail FROM (
    SELECT 'engine-queueing' AS id,
        'up to ' || _n(e.requests_waiting_max) || ' requests waited at one scrape (mean ' || _f(e.requests_waiting_mean, 1)
            || ', ' || (SELECT series FROM c WHERE concept = 'requests_waiting') || ')'
            || coalesce('; the engine''s mean queue time was ' || _ms(e.queue_time_ms_mean) || ' over '
                || _n(e.queue_time_n) || ' requests = ' || _pct(e.queue_time_ms_mean / lat.ttft_ms) || ' of mean TTFT '
                || _ms(lat.ttft_ms) || ' (' || (SELECT series FROM c WHERE concept = 'queue_time') || ')', '')
            || ': the server is saturated; queueing is real' AS detail
    FROM e, lat, _thresholds AS t
    WHERE e.requests_waiting_max >= t.engine_waiting_requests
        AND (e.queue_time_ms_mean IS NULL OR e.queue_time_ms_mean >= t.queue_ttft_share * lat.ttft_ms)
    UNION ALL
    SELECT 'engine-no-queueing',
        'at most ' || _n(e.requests_waiting_max) || ' requests waited at one scrape ('
            || (SELECT series FROM c WHERE concept = 'requests_waiting') || ', ' || _n(e.scrapes) || ' scrapes)'
            || coalesce('; the engine''s mean queue time was ' || _ms(e.queue_time_ms_mean) || ' = '
                || _pct(e.queue_time_ms_mean / lat.ttft_ms) || ' of mean TTFT ('
                || (SELECT series FROM c WHERE concept = 'queue_time') || ')', '')
            || ': queueing is not the story'
    FROM e, lat, _thresholds AS t
    WHERE e.requests_waiting_max < t.engine_waiting_requests
        AND coalesce(e.queue_time_ms_mean < t.misdiagnosis_share * lat.ttft_ms, true)
    UNION ALL
    SELECT 'engine-kv-pressure',
        'KV-cache usage reached ' || _pct(e.kv_cache_usage_max) || ' (mean ' || _pct(e.kv_cache_usage_mean)
            || ', ' || (SELECT series FROM c WHERE concept = 'kv_cache_usage') || ') and the engine preempted '
            || _n(e.preemptions) || ' time(s) in the window (' || (SELECT series FROM c WHERE concept = 'preemptions')
            || '): a preempted request gets no step until it is rescheduled'
            || coalesce(', which explains ITL p99 ' || _ms(itl.p99_ms) || ' against p50 ' || _ms(itl.p50_ms), '')
            || '. Levers: fewer concurrent requests, fp8 KV cache, a larger KV budget'
    FROM e, itl, _thresholds AS t
    WHERE e.kv_cache_usage_max >= t.kv_cache_full AND e.preemptions > 0
    UNION ALL
    SELECT 'engine-prefix-cache-misses',
        'prefix-cache hit rate ' || _pct(e.prefix_cache_hit_rate) || ' ('
            || coalesce((SELECT string_agg(series, ' / ' ORDER BY concept) FROM c
                         WHERE concept IN ('prefix_cache_hits', 'prefix_cache_queries')),
                        (SELECT series FROM c WHERE concept = 'prefix_cache_hit_rate'))
            || ') with prompts of ' || _n(lat.prompt_tokens) || ' tokens on average: if they share a system prompt, '
            || 'the cache is not reusing it and every request pays its prefill again (check that prefix caching is on '
            || 'and that the shared part comes first and is byte-identical)'
    FROM e, lat, _thresholds AS t
    WHERE e.prefix_cache_hit_rate < t.prefix_cache_hit_rate_low AND lat.prompt_tokens >= t.prefix_cache_prompt_tokens
);
