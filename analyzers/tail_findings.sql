-- Module tail_findings: the findings that name a tail's cause (module tail), on the same standard as
-- the others: each fires on measured numbers against thresholds (docs/findings.md), quotes them, and
-- stays silent when the trace cannot say. A cause is named only on a tail of at least
-- tail_min_requests requests (tail_summary.level), on where its extra time is (tail_components) and,
-- for causes that are properties of requests, on a feature that separates its requests
-- (tail_features.separates). When nothing is named, tail-noise says so.

-- The tail each metric explains: its components and its separating features.
CREATE OR REPLACE VIEW _tail_at AS
SELECT c.* FROM tail_components AS c JOIN tail_summary AS s ON s.metric = c.metric AND s.level = c.level;

CREATE OR REPLACE VIEW _tail_sep AS
SELECT f.* FROM tail_features AS f JOIN tail_summary AS s ON s.metric = f.metric AND s.level = f.level
WHERE f.separates;

-- @table tail_findings_catalogue
-- The findings about the tail (appended to findings_catalogue).
-- @column ordinal: Position in the catalogue (after the engine's).
-- @column id: Stable identifier (kebab-case).
-- @column severity: 'warning' or 'info'.
-- @column title: One-line statement of the finding.
-- @column fires_when: The condition, in words, with the thresholds it uses.
CREATE OR REPLACE TEMP TABLE tail_findings_catalogue AS
SELECT * FROM (VALUES
    (201, 'tail-queue-bursts', 'warning', 'The tail is queueing behind bursts of arrivals',
        'for the TTFT (else e2e) tail explained (tail_min_requests): queue holds at least tail_component_share of the gap to the typical requests (or, with no queue span, what no component measured does while the engine''s metrics saw engine_waiting_requests waiting), and a load feature (arrivals in the second before, requests in flight, the engine''s waiting requests) separates the tail (tail_effect_size, tail_significance)'),
    (202, 'tail-long-prompts', 'warning', 'The tail is a few long prompts',
        'for the TTFT (else e2e) tail: prompt length separates it with a mean at least tail_ratio times the typical one, and prefill plus tokenize hold at least tail_component_share of the gap (or prefill is not measured and what no component measured does)'),
    (203, 'tail-prefill-interference', 'warning', 'Co-scheduled prefill is behind the ITL spikes',
        'the slowest ITL gaps (else the TPOT tail) spend at least tail_component_share of their difference from typical gaps waiting through or sharing steps with other requests'' prefill (step accounting)'),
    (204, 'tail-preemption', 'warning', 'Preemption stalls make the tail',
        'the slowest ITL gaps (else the TPOT tail) spend at least tail_component_share of their difference from typical gaps preempted (no step while the engine kept stepping)'),
    (205, 'tail-slow-replica', 'warning', 'One replica holds the tail',
        'with several replicas (traces), one is over-represented in the TTFT, e2e or TPOT tail: its share of the tail against its share of typical requests separates them (tail_effect_size, tail_significance)'),
    (206, 'tail-client-delay', 'warning', 'The load client''s own delay makes the tail',
        'for the TTFT (else e2e) tail: client_queue (waiting in the load client after the intended send time) holds at least tail_component_share of the gap'),
    (207, 'tail-new-connections', 'warning', 'New-connection handshakes make the tail',
        'for the TTFT (else e2e) tail: opening a connection separates its requests and network holds at least tail_component_share of the gap'),
    (208, 'tail-long-outputs', 'info', 'The e2e tail is long answers, not slow ones',
        'for the e2e tail: output length separates it with a mean at least tail_ratio times the typical one and decode holds at least tail_component_share of the gap'),
    (209, 'tail-noise', 'info', 'Nothing the trace holds separates the tail: a tail of noise',
        'a TTFT, e2e or TPOT tail of at least tail_min_requests requests is explained and no other tail finding fires: no feature separates its requests and no decode part or load-client wait dominates it')
) AS v(ordinal, id, severity, title, fires_when);

-- @view tail_findings
-- The tail findings that fire, one row each (the metric they were found on is the first of TTFT, e2e,
-- TPOT, ITL that qualifies).
-- @column id: Stable identifier (see tail_findings_catalogue, docs/findings.md).
-- @column metric: The metric whose tail the finding is about: 'ttft', 'e2e', 'tpot' or 'itl'.
-- @column detail: The evidence: measured numbers with units, group sizes and effect sizes.
CREATE OR REPLACE VIEW tail_findings AS
WITH s AS (
    SELECT *, CASE metric WHEN 'ttft' THEN 1 WHEN 'e2e' THEN 2 WHEN 'tpot' THEN 3 ELSE 4 END AS prio,
        level || ' ' || _tail_metric(metric) || ' (' || _n(tail_n) || CASE WHEN metric = 'itl' THEN ' gaps' ELSE ' requests' END
            || ' above ' || _ms(threshold_ms) || ', mean ' || _ms(tail_ms) || ', against ' || _n(typical_n)
            || ' typical, mean ' || _ms(typical_ms) || ': +' || _ms(gap_ms) || ')' AS head
    FROM tail_summary WHERE level IS NOT NULL
),
top AS (  -- each explained tail's strongest feature, separating or not
    SELECT s.metric, f.label || ', Cliff''s delta ' || _f(f.cliffs_delta, 2) AS text
    FROM s JOIN tail_features AS f ON f.metric = s.metric AND f.level = s.level AND f.rank = 1
),
sep AS (  -- separating features in words, per metric and kind of feature
    SELECT metric,
        string_agg(label || ' median ' || _tail_num(tail_median) || ' vs ' || _tail_num(typical_median) || ', Cliff''s delta '
            || _f(cliffs_delta, 2), '; ' ORDER BY rank)
            FILTER (WHERE feature IN ('arrivals_1s', 'in_flight', 'engine_waiting') AND cliffs_delta > 0) AS load_text
    FROM _tail_sep GROUP BY metric
),
eng AS (
    SELECT max(requests_waiting_max) AS waiting_max, max(queue_time_ms_mean) AS queue_ms,
        max(queue_time_ms_p95_max) AS queue_p95_max, max(queue_time_n) AS queue_n
    FROM engine_summary WHERE (SELECT count(*) FROM engine_summary) = 1
),
part AS (SELECT metric, component, measured, delta_ms, gap_share, typical_ms, tail_ms FROM _tail_at),
cand AS (
    SELECT 'tail-queue-bursts' AS id, s.prio, s.metric,
        s.head || ': ' || CASE WHEN q.measured THEN 'queue holds ' || _ms(q.delta_ms) || ' of it = ' || _pct(q.gap_share)
                || ' (' || _ms(q.tail_ms) || ' per tail request against ' || _ms(q.typical_ms) || ')'
            ELSE 'queue is not measured per request; ' || _pct(u.gap_share) || ' of it is outside every measured component '
                || 'while the engine had up to ' || _n(eng.waiting_max) || ' requests waiting' END
            || CASE WHEN eng.queue_ms IS NOT NULL THEN '; the engine''s own queue time: mean ' || _ms(eng.queue_ms)
                || ' over ' || _n(eng.queue_n) || ' requests in the window'
                || CASE WHEN eng.queue_p95_max IS NOT NULL THEN ', p95 at most ' || _ms(eng.queue_p95_max) ELSE '' END
                ELSE '' END
            || '. The tail arrived in bursts: ' || sep.load_text
            || '. The server queued them behind the load of the moment: capacity, admission control or smoother '
            || 'arrivals move this tail, not the network or the model' AS detail
    FROM s JOIN part AS q ON q.metric = s.metric AND q.component = 'queue'
    JOIN part AS u ON u.metric = s.metric AND u.component = 'unattributed'
    JOIN sep ON sep.metric = s.metric AND sep.load_text IS NOT NULL
    CROSS JOIN _thresholds AS t LEFT JOIN eng ON true
    WHERE s.metric IN ('ttft', 'e2e') AND ((q.measured AND q.gap_share >= t.tail_component_share)
        OR (NOT q.measured AND u.gap_share >= t.tail_component_share AND eng.waiting_max >= t.engine_waiting_requests))
    UNION ALL
    SELECT 'tail-long-prompts', s.prio, s.metric,
        s.head || ': its prompts average ' || _n(f.tail_mean) || ' tokens against ' || _n(f.typical_mean) || ' ('
            || _f(f.ratio, 1) || 'x, Cliff''s delta ' || _f(f.cliffs_delta, 2) || ', ' || _n(f.tail_n) || ' vs '
            || _n(f.typical_n) || ' requests); '
            || CASE WHEN p.measured THEN 'prefill and tokenize hold ' || _pct(p.gap_share + coalesce(k.gap_share, 0))
                || ' of the gap (prefill ' || _ms(p.tail_ms) || ' per tail request against ' || _ms(p.typical_ms) || ')'
                ELSE 'prefill is not measured per request; ' || _pct(u.gap_share) || ' of the gap is outside every '
                    || 'measured component' END
            || ': long prompts, not load; prefix caching, chunked prefill or a separate queue for long prompts'
    FROM s JOIN _tail_sep AS f ON f.metric = s.metric AND f.feature = 'prompt_tokens'
    JOIN part AS p ON p.metric = s.metric AND p.component = 'prefill'
    LEFT JOIN part AS k ON k.metric = s.metric AND k.component = 'tokenize' AND k.measured
    JOIN part AS u ON u.metric = s.metric AND u.component = 'unattributed'
    CROSS JOIN _thresholds AS t
    WHERE s.metric IN ('ttft', 'e2e') AND f.cliffs_delta > 0 AND f.ratio >= t.tail_ratio
        AND CASE WHEN p.measured THEN p.gap_share + coalesce(k.gap_share, 0) >= t.tail_component_share
                 ELSE u.gap_share >= t.tail_component_share END
    UNION ALL
    SELECT 'tail-prefill-interference', CASE WHEN s.metric = 'itl' THEN 0 ELSE s.prio END, s.metric,
        s.head || ': co-scheduled prefill takes ' || _ms(p.tail_ms) || ' of each ' || CASE WHEN s.metric = 'itl'
            THEN 'slow gap' ELSE 'decode token of the tail' END || ' against ' || _ms(p.typical_ms) || ' = '
            || _pct(p.gap_share) || ' of the difference'
            || CASE WHEN s.metric = 'itl' AND g.with_prefill_share IS NOT NULL THEN '; ' || _pct(g.with_prefill_share)
                || ' of the slow gaps waited through or shared a step with prefill work, against '
                || _pct(ty.with_prefill_share) || ' of typical gaps' ELSE '' END
            || ': cap the prefill work per step (vLLM --enable-chunked-prefill with a smaller max_num_batched_tokens, '
            || 'SGLang --chunked-prefill-size) or disaggregate prefill'
    FROM s JOIN part AS p ON p.metric = s.metric AND p.component = 'prefill' AND p.measured
    LEFT JOIN tail_groups AS g ON g.metric = s.metric AND g.level = s.level
    LEFT JOIN tail_groups AS ty ON ty.metric = s.metric AND ty.level = 'typical'
    CROSS JOIN _thresholds AS t
    WHERE s.metric IN ('itl', 'tpot') AND p.gap_share >= t.tail_component_share
    UNION ALL
    SELECT 'tail-preemption', CASE WHEN s.metric = 'itl' THEN 0 ELSE s.prio END, s.metric,
        s.head || ': preemption stalls (no step while the engine kept stepping) take ' || _ms(p.tail_ms) || ' of each '
            || CASE WHEN s.metric = 'itl' THEN 'slow gap' ELSE 'decode token of the tail' END || ' against '
            || _ms(p.typical_ms) || ' = ' || _pct(p.gap_share) || ' of the difference'
            || CASE WHEN s.metric = 'itl' AND g.preempted_share IS NOT NULL THEN '; ' || _pct(g.preempted_share)
                || ' of the slow gaps are stalls' ELSE '' END
            || '; the KV cache ran out of room: more KV-cache memory, fewer sequences at once (vLLM --max-num-seqs) '
            || 'or shorter outputs'
    FROM s JOIN part AS p ON p.metric = s.metric AND p.component = 'no_step' AND p.measured
    LEFT JOIN tail_groups AS g ON g.metric = s.metric AND g.level = s.level
    CROSS JOIN _thresholds AS t
    WHERE s.metric IN ('itl', 'tpot') AND p.gap_share >= t.tail_component_share
    UNION ALL
    SELECT 'tail-slow-replica', s.prio + 10 * (1 - f.cliffs_delta), s.metric,
        s.head || ': ' || substr(f.feature, 9) || ' holds ' || _pct(f.tail_mean) || ' of the tail against '
            || _pct(f.typical_mean) || ' of typical requests (Cliff''s delta ' || _f(f.cliffs_delta, 2) || ', '
            || _n(f.tail_n) || ' vs ' || _n(f.typical_n) || ' requests)'
            || coalesce('; the tail''s extra time: ' || s.components_text, '')
            || ': look at that replica (its hardware, its load balancer weight, its neighbours) before the model'
    FROM s JOIN _tail_sep AS f ON f.metric = s.metric AND f.feature LIKE 'replica=%'
    WHERE s.metric IN ('ttft', 'e2e', 'tpot') AND f.cliffs_delta > 0
    UNION ALL
    SELECT 'tail-client-delay', s.prio, s.metric,
        s.head || ': client_queue (waiting in the load client after the intended send time) holds ' || _ms(q.delta_ms)
            || ' of it = ' || _pct(q.gap_share) || ' (' || _ms(q.tail_ms) || ' per tail request against '
            || _ms(q.typical_ms) || ')'
            || coalesce('; the load client''s event loop stalled ' || _ms(lg.tail_mean) || ' during each tail request against '
                || _ms(lg.typical_mean) || ' (Cliff''s delta ' || _f(lg.cliffs_delta, 2) || ')', '')
            || ': the delay is the load client''s own (event-loop lag, GC, a concurrency cap), not the server''s; '
            || 'run fewer requests per probe process or raise --concurrency'
    FROM s JOIN part AS q ON q.metric = s.metric AND q.component = 'client_queue' AND q.measured
    LEFT JOIN _tail_sep AS lg ON lg.metric = s.metric AND lg.feature = 'client_lag_ms' AND lg.cliffs_delta > 0
    CROSS JOIN _thresholds AS t
    WHERE s.metric IN ('ttft', 'e2e') AND q.gap_share >= t.tail_component_share
    UNION ALL
    SELECT 'tail-new-connections', s.prio, s.metric,
        s.head || ': ' || _pct(f.tail_mean) || ' of the tail opened a new connection against ' || _pct(f.typical_mean)
            || ' of typical requests (Cliff''s delta ' || _f(f.cliffs_delta, 2) || '), and network holds ' || _ms(n.delta_ms)
            || ' of the gap = ' || _pct(n.gap_share) || ': each new connection pays TCP (and TLS) round trips; keep '
            || 'connections alive and pooled, or warm them up before the load'
    FROM s JOIN _tail_sep AS f ON f.metric = s.metric AND f.feature = 'new_connection'
    JOIN part AS n ON n.metric = s.metric AND n.component = 'network' AND n.measured
    CROSS JOIN _thresholds AS t
    WHERE s.metric IN ('ttft', 'e2e') AND f.cliffs_delta > 0 AND n.gap_share >= t.tail_component_share
    UNION ALL
    SELECT 'tail-long-outputs', s.prio, s.metric,
        s.head || ': its answers average ' || _n(f.tail_mean) || ' tokens against ' || _n(f.typical_mean) || ' ('
            || _f(f.ratio, 1) || 'x, Cliff''s delta ' || _f(f.cliffs_delta, 2) || ') and decode holds '
            || _pct(d.gap_share) || ' of the gap: these requests are long, not slow (see the TPOT tail for slow '
            || 'decoding)'
    FROM s JOIN _tail_sep AS f ON f.metric = s.metric AND f.feature = 'output_tokens'
    JOIN part AS d ON d.metric = s.metric AND d.component = 'decode' AND d.measured
    CROSS JOIN _thresholds AS t
    WHERE s.metric = 'e2e' AND f.cliffs_delta > 0 AND f.ratio >= t.tail_ratio AND d.gap_share >= t.tail_component_share
),
named AS (
    SELECT id, metric, detail FROM (
        SELECT *, row_number() OVER (PARTITION BY id ORDER BY prio, metric) AS rn FROM cand) AS x
    WHERE rn = 1
),
noise AS (
    SELECT 'tail-noise' AS id, arg_min(s.metric, s.prio) AS metric,
        string_agg(s.head || ': ' || coalesce(s.components_text, 'no component grew') || '; strongest feature: '
            || coalesce(top.text, 'none measured'), ' | ' ORDER BY s.prio)
        || '. None of what the trace holds about these requests (prompt and output length, arrival, the arrivals '
        || 'before them, requests in flight, the engine''s queue, replica, connection, retries, preemptions, '
        || 'co-scheduled prefill) separates them from typical requests: a tail of noise, no cause named' AS detail
    FROM s LEFT JOIN top USING (metric)
    WHERE s.metric IN ('ttft', 'e2e', 'tpot') AND s.separating = 0 AND NOT EXISTS (SELECT 1 FROM named)
    HAVING count(*) > 0
)
SELECT id, metric, detail FROM named
UNION ALL
SELECT id, metric, detail FROM noise;
