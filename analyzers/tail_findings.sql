-- Module tail_findings: the findings that name a tail's cause (module tail), on the same standard as
-- the others: each fires on measured numbers against thresholds (docs/findings.md), quotes them, and
-- stays silent when the trace cannot say. A cause is named only on a tail of at least
-- tail_min_requests requests (tail_summary.level), on where its extra time is (tail_components) and,
-- for causes that are properties of requests, on a feature that separates its requests
-- (tail_features.separates). When nothing is named, tail-noise says so.

-- @table tail_findings_catalogue
-- The findings about the tail (appended to findings_catalogue).
-- @column ordinal: Position in the catalogue (after the engine's).
-- @column id: Stable identifier (kebab-case).
-- @column suspect: The suspect the finding is evidence about, the row of the TUI's Diagnosis panel it is shown on: a component (tracetool.schema COMPONENTS), 'replica' (one replica of several) or 'evidence' (the trace itself: what it holds, what failed, what it cannot say).
-- @column severity: 'warning' or 'info'.
-- @column title: One-line statement of the finding.
-- @column fires_when: The condition, in words, with the thresholds it uses.
CREATE OR REPLACE TEMP TABLE tail_findings_catalogue AS
SELECT * FROM (VALUES
    (201, 'tail-queue-bursts', 'queue', 'warning', 'The tail is queueing behind the load of the moment',
        'for the TTFT (else e2e) tail explained (tail_min_requests): queue (with the server''s frontend where the spans are its engine''s and the frontend grew) holds at least tail_component_share of the gap to the typical requests (or, with no queue span, what no component measured does while the engine''s metrics saw engine_waiting_requests waiting), and a load feature (arrivals in the second before, requests in flight, the engine''s waiting requests) separates the tail (tail_effect_size, tail_significance); bursts when the arrivals in the second before separate it, a server behind its offered load when only the others do'),
    (202, 'tail-long-prompts', 'prefill', 'warning', 'The tail is a few long prompts',
        'for the TTFT (else e2e) tail: prompt length separates it with a mean at least tail_ratio times the typical one, and prefill plus tokenize hold at least tail_component_share of the gap (or prefill is not measured and what no component measured does)'),
    (203, 'tail-prefill-interference', 'decode', 'warning', 'Co-scheduled prefill is behind the ITL spikes',
        'the slowest ITL gaps spend at least tail_component_share of their difference from typical gaps waiting through or sharing steps with other requests'' prefill (step accounting)'),
    (204, 'tail-preemption', 'decode', 'warning', 'Preemption stalls make the tail',
        'the slowest ITL gaps (else the TPOT tail) spend at least tail_component_share of their difference from typical gaps preempted (no step while the engine kept stepping)'),
    (205, 'tail-slow-replica', 'replica', 'warning', 'One replica holds the tail',
        'with several replicas (traces), one is over-represented in the TTFT, e2e or TPOT tail: its share of the tail against its share of typical requests separates them (tail_effect_size, tail_significance)'),
    (206, 'tail-client-delay', 'client_queue', 'warning', 'The load client''s own delay makes the tail',
        'for the TTFT (else e2e) tail: client_queue (waiting in the load client after the intended send time) holds at least tail_component_share of the gap'),
    (207, 'tail-new-connections', 'network', 'warning', 'New-connection handshakes make the tail',
        'for the TTFT (else e2e) tail: opening a connection separates its requests and network holds at least tail_component_share of the gap'),
    (208, 'tail-long-outputs', 'decode', 'info', 'The e2e tail is long answers, not slow ones',
        'for the e2e tail: output length separates it with a mean at least tail_ratio times the typical one and decode holds at least tail_component_share of the gap'),
    (209, 'tail-noise', 'evidence', 'info', 'Nothing the trace holds separates the tail: a tail of noise',
        'a TTFT, e2e or TPOT tail of at least tail_min_requests requests is explained and no other tail finding fires: no feature separates its requests and no decode part or load-client wait dominates it')
) AS v(ordinal, id, suspect, severity, title, fires_when);

-- @table tail_findings
-- The tail findings that fire, one row each (the metric they were found on is the first of TTFT, e2e,
-- TPOT, ITL that qualifies).
-- @column id: Stable identifier (see tail_findings_catalogue, docs/findings.md).
-- @column metric: The metric whose tail the finding is about: 'ttft', 'e2e', 'tpot' or 'itl'.
-- @column detail: The evidence: measured numbers with units, group sizes and effect sizes.
CREATE OR REPLACE TEMP TABLE tail_findings AS
-- One row per explained tail with what the findings test and quote (the texts of tail_components and
-- tail_features, written there once: formatting numbers is most of what such a statement costs to plan),
-- then every finding's detail in one projection, unnested, as module findings does.
WITH s AS (
    SELECT metric, level, head, components_text, separating,
        CASE metric WHEN 'ttft' THEN 1 WHEN 'e2e' THEN 2 WHEN 'tpot' THEN 3 ELSE 4 END AS prio
    FROM tail_summary WHERE level IS NOT NULL
),
c AS (
    SELECT c.metric,
        any_value(struct_pack(measured := c.measured, gap_share := c.gap_share, text := c.text)) FILTER (WHERE c.component = 'queue') AS q,
        any_value(struct_pack(measured := c.measured, gap_share := c.gap_share, text := c.text)) FILTER (WHERE c.component = 'unattributed') AS u,
        any_value(struct_pack(measured := c.measured, gap_share := c.gap_share, text := c.text)) FILTER (WHERE c.component = 'frontend') AS fe,
        -- the frontend's share of the gap where measured and it grew (module attribution: server_scope engine)
        coalesce(greatest(any_value(c.gap_share) FILTER (WHERE c.component = 'frontend' AND c.measured), 0), 0) AS fe_wait,
        any_value(struct_pack(measured := c.measured, gap_share := c.gap_share, text := c.text)) FILTER (WHERE c.component = 'prefill') AS p,
        any_value(struct_pack(measured := c.measured, gap_share := c.gap_share, text := c.text)) FILTER (WHERE c.component = 'tokenize') AS k,
        any_value(struct_pack(measured := c.measured, gap_share := c.gap_share, text := c.text)) FILTER (WHERE c.component = 'no_step') AS ns,
        any_value(struct_pack(measured := c.measured, gap_share := c.gap_share, text := c.text)) FILTER (WHERE c.component = 'client_queue') AS cq,
        any_value(struct_pack(measured := c.measured, gap_share := c.gap_share, text := c.text)) FILTER (WHERE c.component = 'network') AS n,
        any_value(struct_pack(measured := c.measured, gap_share := c.gap_share, text := c.text)) FILTER (WHERE c.component = 'decode') AS d
    FROM tail_components AS c JOIN s ON s.metric = c.metric AND s.level = c.level
    GROUP BY c.metric
),
f AS (  -- the separating features the findings name (for the load, all of them)
    SELECT f.metric,
        string_agg(f.text, '; ' ORDER BY f.rank)
            FILTER (WHERE f.feature IN ('arrivals_1s', 'in_flight', 'engine_waiting') AND f.cliffs_delta > 0) AS load_text,
        -- bursts only when the arrivals just before separate the tail; in flight or waiting alone is a server
        -- behind its offered load (a queue that grows through the run), whose lever is capacity, not smoothing
        count(*) FILTER (WHERE f.feature = 'arrivals_1s' AND f.cliffs_delta > 0) > 0 AS bursty,
        any_value(struct_pack(text := f.text, ratio := f.ratio, cliffs_delta := f.cliffs_delta)) FILTER (WHERE f.feature = 'prompt_tokens' AND f.cliffs_delta > 0) AS prompt,
        any_value(struct_pack(text := f.text, ratio := f.ratio, cliffs_delta := f.cliffs_delta)) FILTER (WHERE f.feature = 'output_tokens' AND f.cliffs_delta > 0) AS output,
        any_value(struct_pack(text := f.text, ratio := f.ratio, cliffs_delta := f.cliffs_delta)) FILTER (WHERE f.feature = 'new_connection' AND f.cliffs_delta > 0) AS conn,
        any_value(struct_pack(text := f.text, ratio := f.ratio, cliffs_delta := f.cliffs_delta)) FILTER (WHERE f.feature = 'client_lag_share' AND f.cliffs_delta > 0) AS lag,
        arg_max(struct_pack(text := f.text, ratio := f.ratio, cliffs_delta := f.cliffs_delta), f.cliffs_delta) FILTER (WHERE f.feature LIKE 'replica=%' AND f.cliffs_delta > 0) AS replica
    FROM tail_features AS f JOIN s ON s.metric = f.metric AND s.level = f.level
    WHERE f.separates
    GROUP BY f.metric
),
e AS (  -- the engine's own queue (module engine), one trace's
    SELECT max(requests_waiting_max) AS waiting_max,
        max('the engine''s own queue time: mean ' || _ms(queue_time_ms_mean) || ' over ' || queue_time_n::BIGINT
            || ' requests in the window') AS queue_text
    FROM engine_summary WHERE (SELECT count(*) FROM engine_summary) = 1
),
x AS (
    SELECT s.metric, unnest([
    -- the server's wait: its engine's queue and, where the spans are its engine's (frontend measured), the
    -- wait before the engine in its API server, which shares a CPU with the engine and works for every
    -- request in flight (a real vLLM on two cores put a burst's tail there)
    {'id': 'tail-queue-bursts', 'prio': s.prio, 'detail': CASE WHEN s.metric IN ('ttft', 'e2e') AND f.load_text IS NOT NULL
        AND ((c.q.measured AND c.q.gap_share + c.fe_wait >= t.tail_component_share)
             OR (NOT c.q.measured AND c.u.gap_share >= t.tail_component_share AND e.waiting_max >= t.engine_waiting_requests))
        THEN s.head || ': ' || CASE WHEN c.q.measured THEN c.q.text
                || CASE WHEN c.fe_wait > 0 THEN '; outside its engine''s span, the server''s ' || c.fe.text ELSE '' END
            ELSE 'queue is not measured per request, and ' || c.u.text || ', outside every measured component, while '
                || 'the engine had up to ' || e.waiting_max::BIGINT || ' requests waiting' END
            || coalesce('; ' || e.queue_text, '')
            || CASE WHEN c.q.measured AND c.fe_wait > c.q.gap_share THEN '. Most of the wait was in the server''s '
                || 'frontend, before or after its engine: the API server works for every request in flight and shares '
                || 'its CPU with the engine (vLLM: more API server processes)' ELSE '' END
            || CASE WHEN f.bursty
                THEN '. The tail arrived in bursts: ' || f.load_text
                    || '. The server queued them behind the load of the moment: capacity, admission control or '
                    || 'smoother arrivals move this tail, not the network or the model'
                ELSE '. The tail arrived when more requests were ahead of it, not in bursts (the arrivals in the '
                    || 'second before do not separate it): ' || f.load_text
                    || '. The server was behind its offered load: capacity or admission control move this tail, '
                    || 'not smoother arrivals, the network or the model' END END},
    {'id': 'tail-long-prompts', 'prio': s.prio, 'detail': CASE WHEN s.metric IN ('ttft', 'e2e') AND f.prompt.ratio >= t.tail_ratio
        AND CASE WHEN c.p.measured THEN c.p.gap_share + coalesce(c.k.gap_share, 0) >= t.tail_component_share
                 ELSE c.u.gap_share >= t.tail_component_share END
        THEN s.head || ': ' || f.prompt.text || '; ' || CASE WHEN c.p.measured THEN c.p.text
                || CASE WHEN c.k.measured THEN ', ' || c.k.text ELSE '' END
            ELSE 'prefill is not measured per request, and ' || c.u.text || ', outside every measured component' END
            || ': long prompts, not load; prefix caching, chunked prefill or a separate queue for long prompts' END},
    -- the decode parts: the slowest ITL gaps (preemption also the TPOT tail, whose preempted time is measured)
    {'id': 'tail-prefill-interference', 'prio': CASE WHEN s.metric = 'itl' THEN 0 ELSE s.prio END,
        'detail': CASE WHEN s.metric = 'itl' AND c.p.measured AND c.p.gap_share >= t.tail_component_share
        THEN s.head || ': co-scheduled prefill, ' || c.p.text
            || CASE WHEN s.metric = 'itl' AND g.with_prefill_share IS NOT NULL THEN '; ' || round(100 * g.with_prefill_share)::BIGINT
                || ' % of the slow gaps waited through or shared a step with prefill work, against '
                || round(100 * ty.with_prefill_share)::BIGINT || ' % of typical gaps' ELSE '' END
            || ': cap the prefill work per step (vLLM --enable-chunked-prefill with a smaller max_num_batched_tokens, '
            || 'SGLang --chunked-prefill-size) or disaggregate prefill' END},
    {'id': 'tail-preemption', 'prio': CASE WHEN s.metric = 'itl' THEN 0 ELSE s.prio END,
        'detail': CASE WHEN s.metric IN ('itl', 'tpot') AND c.ns.measured AND c.ns.gap_share >= t.tail_component_share
        THEN s.head || ': preemption stalls (no step while the engine kept stepping), ' || c.ns.text
            || CASE WHEN s.metric = 'itl' AND g.preempted_share IS NOT NULL THEN '; ' || round(100 * g.preempted_share)::BIGINT
                || ' % of the slow gaps are stalls' ELSE '' END
            || '; the KV cache ran out of room: more KV-cache memory, fewer sequences at once (vLLM --max-num-seqs) '
            || 'or shorter outputs' END},
    -- the replica most over-represented in any tail
    {'id': 'tail-slow-replica', 'prio': s.prio + 10 * (1 - f.replica.cliffs_delta),
        'detail': CASE WHEN s.metric IN ('ttft', 'e2e', 'tpot') AND f.replica IS NOT NULL
        THEN s.head || ': ' || f.replica.text || coalesce('; the tail''s extra time: ' || s.components_text, '')
            || ': look at that replica (its hardware, its load balancer weight, its neighbours) before the model' END},
    {'id': 'tail-client-delay', 'prio': s.prio, 'detail': CASE WHEN s.metric IN ('ttft', 'e2e') AND c.cq.measured
        AND c.cq.gap_share >= t.tail_component_share
        THEN s.head || ': waiting in the load client after the intended send time, ' || c.cq.text
            || coalesce('; ' || f.lag.text, '')
            || ': the delay is the load client''s own (event-loop lag, GC, a concurrency cap), not the server''s; '
            || 'run fewer requests per probe process or raise --concurrency' END},
    {'id': 'tail-new-connections', 'prio': s.prio, 'detail': CASE WHEN s.metric IN ('ttft', 'e2e') AND f.conn IS NOT NULL
        AND c.n.measured AND c.n.gap_share >= t.tail_component_share
        THEN s.head || ': ' || f.conn.text || '; ' || c.n.text || ': each new connection pays TCP (and TLS) round '
            || 'trips; keep connections alive and pooled, or warm them up before the load' END},
    {'id': 'tail-long-outputs', 'prio': s.prio, 'detail': CASE WHEN s.metric = 'e2e' AND f.output.ratio >= t.tail_ratio
        AND c.d.measured AND c.d.gap_share >= t.tail_component_share
        THEN s.head || ': ' || f.output.text || '; ' || c.d.text || ': these requests are long, not slow (see the TPOT '
            || 'tail for slow decoding)' END}
    ], recursive := true)
    FROM s
    LEFT JOIN c USING (metric)
    LEFT JOIN f USING (metric)
    LEFT JOIN tail_groups AS g ON g.metric = s.metric AND g.level = s.level
    LEFT JOIN tail_groups AS ty ON ty.metric = s.metric AND ty.level = 'typical'
    CROSS JOIN _thresholds AS t
    LEFT JOIN e ON true
),
named AS (
    SELECT id, metric, detail FROM (
        SELECT *, row_number() OVER (PARTITION BY id ORDER BY prio, metric) AS rn FROM x WHERE detail IS NOT NULL) AS y
    WHERE rn = 1
)
SELECT id, metric, detail FROM named
UNION ALL
-- when nothing is named: each explained tail with where its time is and its strongest (non-separating) feature
SELECT 'tail-noise', arg_min(s.metric, s.prio),
    string_agg(s.head || ': ' || coalesce(s.components_text, 'no component grew') || '; strongest feature: '
        || coalesce(top.text, 'none measured'), ' | ' ORDER BY s.prio)
    || '. None of what the trace holds about these requests (prompt and output length, arrival, the arrivals '
    || 'before them, requests in flight, the engine''s queue, replica, connection, retries, preemptions, '
    || 'co-scheduled prefill) separates them from typical requests: a tail of noise, no cause named'
FROM s LEFT JOIN tail_features AS top ON top.metric = s.metric AND top.level = s.level AND top.rank = 1
WHERE s.metric IN ('ttft', 'e2e', 'tpot') AND s.separating = 0 AND NOT EXISTS (SELECT 1 FROM named)
HAVING count(*) > 0;
