-- Module claims: verdicts on the stories users bring (--claim). A verdict is the
-- measured share with its evidence, never a rule of thumb (docs/domain.md §3).
--
-- Component claims: 'supported' when the component is the bottleneck or holds at
-- least supported_share of e2e; 'misdiagnosis' when it holds less than
-- misdiagnosis_share and is not the bottleneck; 'contributing' otherwise;
-- 'unmeasured' when the trace cannot say. 'compute-bound' ("decode is
-- compute-bound; more FLOPs will help") is judged on the roofline: compute time
-- over memory time of a step. 'throughput' ("the server does thousands of tok/s,
-- so decode must be sub-second") is judged on the measured decode time per request.
--
-- Claims about a tail (p99-ttft=network: a percentile, a metric, a component) are judged on the
-- tail the module tail compares with the typical requests: the component's share of the gap between
-- the two groups' means, with the same thresholds ('supported' when it holds the most of the gap
-- or at least supported_share; 'misdiagnosis' below misdiagnosis_share and not the most), and
-- 'unmeasured' when the tail has fewer than tail_min_requests requests or no request measured the
-- component.

-- @table claims_catalogue
-- The claims the analyzer can judge (aliases are resolved before SQL, in analyzers/params.py).
-- @column key: Claim key.
-- @column component: The component the verdict is about.
-- @column statement: The story, in words.
CREATE OR REPLACE TEMP TABLE claims_catalogue AS
SELECT * FROM (VALUES
    ('network', 'network', 'It''s the network RTT.'),
    ('frontend', 'frontend', 'It''s the server''s frontend (HTTP handling, chat template, streaming).'),
    ('queue', 'queue', 'It''s queueing: the server is overloaded.'),
    ('tokenize', 'tokenize', 'It''s tokenizer overhead.'),
    ('preprocess', 'preprocess', 'It''s pre-processing (retrieval, templating, guardrails).'),
    ('prefill', 'prefill', 'It''s prefill: the prompt is too long.'),
    ('decode', 'decode', 'It''s decode: generating the tokens.'),
    ('detokenize', 'detokenize', 'It''s detokenization.'),
    ('postprocess', 'postprocess', 'It''s post-processing (reranking, filters, serialisation).'),
    ('other', 'other', 'It''s something outside the named phases.'),
    ('compute-bound', 'decode', 'Decode is compute-bound; more FLOPs will help.'),
    ('throughput', 'decode', 'The server does thousands of tok/s, so decode must be sub-second.')
) AS v(key, component, statement);

-- @table claims
-- One row per claim asked for, in the order asked.
-- @column ordinal: Position on the command line.
-- @column claim: The claim as the user wrote it.
-- @column scope: The tail a claim is about (p99-ttft, p95-e2e...; module tail); null for a claim about the mean request.
-- @column key: The claim key it resolved to.
-- @column component: The component the verdict is about (for a tail claim on TPOT or ITL, the decode part).
-- @column verdict: 'supported', 'contributing', 'misdiagnosis' or 'unmeasured'.
-- @column share: The component's share of e2e, 0..1 (null when not measured); for a tail claim, its share of the gap between the tail and the typical requests.
-- @column basis: What the verdict rests on: 'measured' (the component's share), 'rtt-split' (network measured as the round trips the client's TCP handshakes timed, the rest of the gap to the engine's span being frontend, see network_evidence), 'rtt-bound' (network from the client's TCP handshakes, see network_evidence), 'unsplit' (network and the server's frontend together, not split), 'engine-metrics' (a server component no span measured, from the engine's scraped time histogram over the window: module engine), 'roofline', 'decode-time', 'tail' (a claim about a tail: module tail), or 'none' (unmeasured).
-- @column detail: The evidence: measured numbers with units.
CREATE OR REPLACE TEMP TABLE claims AS
WITH k AS (
    SELECT q.ordinal, q.claim, q.key, c.component, c.statement
    FROM _claims AS q JOIN claims_catalogue AS c USING (key)
    WHERE q.scope_metric IS NULL
),
j AS (
    SELECT k.*, a.measured, a.share, a.ms, a.bottleneck AS is_bottleneck, s.*, t.supported_share AS t_sup,
        t.misdiagnosis_share AS t_mis, t.compute_bound_ratio AS t_cb, t.sub_second_decode_s AS t_sub,
        -- a client-only trace judges the network story on the bound of its TCP handshakes
        (k.component = 'network' AND NOT a.measured AND ne.basis = 'tcp-connect' AND ne.rtt_share IS NOT NULL)
            AS rtt_bound,
        -- an engine's span with no handshake: network and frontend together bound the network story
        (k.component = 'network' AND NOT a.measured AND ne.basis = 'unsplit') AS unsplit,
        ne.outside_ms AS ne_outside_ms, ne.outside_share AS ne_outside_share, ne.basis AS ne_basis,
        ne.verdict AS ne_verdict, ne.rtt_ms AS ne_rtt_ms, ne.rtt_share AS ne_rtt_share, ne.connections AS ne_n,
        ne.round_trips AS ne_trips, ne.bound_share AS ne_bound_share,
        -- a server component no span measured, judged on the engine's own window mean (module engine)
        (NOT a.measured AND eng.mean IS NOT NULL AND s.e2e_mean_ms > 0) AS eng_basis,
        eng.mean * 1000 AS eng_ms, eng.mean * 1000 / s.e2e_mean_ms AS eng_share, eng.samples AS eng_n,
        eng.series AS eng_series
    FROM k
    JOIN attribution_components AS a USING (component)
    CROSS JOIN summary_numbers AS s
    CROSS JOIN _thresholds AS t
    CROSS JOIN network_evidence AS ne
    LEFT JOIN (SELECT concept, mean, samples, series FROM engine_stats
               WHERE kind = 'histogram' AND (SELECT count(*) FROM engine_summary) = 1) AS eng
        ON eng.concept = k.component || '_time'
),
v AS (
    SELECT ordinal, claim, key, component, CASE WHEN eng_basis THEN eng_share ELSE share END AS share,
        CASE
            WHEN key = 'compute-bound' THEN CASE
                WHEN NOT roofline_available OR compute_to_memory IS NULL THEN 'unmeasured'
                WHEN compute_to_memory >= t_cb THEN 'supported'
                WHEN compute_to_memory >= t_cb / 2 THEN 'contributing'
                ELSE 'misdiagnosis' END
            WHEN key = 'throughput' THEN CASE
                WHEN decode_s_mean IS NULL THEN 'unmeasured'
                WHEN decode_s_mean <= t_sub THEN 'supported'
                ELSE 'misdiagnosis' END
            WHEN rtt_bound THEN coalesce(ne_verdict, 'unmeasured')
            WHEN unsplit THEN coalesce(ne_verdict, 'unmeasured')
            WHEN eng_basis THEN CASE WHEN eng_share >= t_sup THEN 'supported'
                                     WHEN eng_share < t_mis THEN 'misdiagnosis' ELSE 'contributing' END
            WHEN NOT measured THEN 'unmeasured'
            WHEN is_bottleneck OR share >= t_sup THEN 'supported'
            WHEN share < t_mis THEN 'misdiagnosis'
            ELSE 'contributing'
        END AS verdict,
        CASE
            WHEN key = 'compute-bound' THEN CASE WHEN roofline_available AND compute_to_memory IS NOT NULL
                THEN 'roofline' ELSE 'none' END
            WHEN key = 'throughput' THEN CASE WHEN decode_s_mean IS NOT NULL THEN 'decode-time' ELSE 'none' END
            WHEN rtt_bound THEN 'rtt-bound'
            WHEN unsplit THEN 'unsplit'
            WHEN key = 'network' AND measured AND ne_basis = 'rtt-split' THEN 'rtt-split'
            WHEN eng_basis THEN 'engine-metrics'
            WHEN measured THEN 'measured'
            ELSE 'none'
        END AS basis,
        CASE
            WHEN key = 'compute-bound' THEN CASE
                WHEN NOT roofline_available OR compute_to_memory IS NULL THEN
                    CASE WHEN hardware_kind = 'cpu' THEN coalesce(roofline_note, 'a CPU run: no GPU roofline')
                         ELSE 'no roofline (' || coalesce(roofline_note, 'model or GPU unknown')
                              || '): pass --model and --gpu' END
                ELSE 'a decode step needs ' || _ms(ideal_step_ms) || ' to stream weights and KV cache but '
                    || _ms(ideal_step_ms * compute_to_memory) || ' for its FLOPs (' || _f(compute_to_memory, 2)
                    || 'x); measured ' || _ms(measured_step_ms) || ' = ' || _pct(bandwidth_efficiency)
                    || ' of peak bandwidth'
                    || CASE WHEN compute_to_memory < t_cb THEN ': decode sits on the memory side of the '
                        || 'roofline, so more FLOPs will not move ITL' ELSE ': at this batch size compute matters' END
                END
            WHEN key = 'throughput' THEN CASE
                WHEN decode_s_mean IS NULL THEN 'no request has two or more tokens and a TTFT'
                ELSE 'each request decodes at ' || _f(per_request_tok_s, 1) || ' tok/s and spends '
                    || _f(decode_s_mean, 2) || ' s from first to last token, while the aggregate is '
                    || _n(aggregate_tok_s) || ' tok/s across ' || _f(mean_concurrency, 1)
                    || ' requests in flight: aggregate throughput is not per-request speed'
                END
            WHEN rtt_bound THEN 'network is not measured per request; the TCP handshake ('
                || CASE WHEN ne_n = 1 THEN 'one connection' ELSE 'median of ' || _n(ne_n) || ' connections' END
                || ') puts one round trip at ' || _ms(ne_rtt_ms) || ' = '
                || _pct(ne_rtt_share) || ' of e2e and ' || _n(ne_trips) || ' round trips at '
                || _pct(ne_bound_share) || ': network lies between the two'
                || CASE WHEN ne_verdict IS NULL THEN ', which straddle a threshold: measure it with server timing'
                        ELSE '' END
            WHEN unsplit THEN 'the client''s time beyond what the server says it spent is '
                || _ms(ne_outside_ms) || ' per request = ' || _pct(ne_outside_share) || ' of e2e: network and '
                || 'server time together, not split (no TCP handshake was timed)'
                || CASE WHEN ne_verdict = 'misdiagnosis' THEN ': even all of it would be a small share'
                        ELSE ': network is at most that' END
            WHEN eng_basis THEN component || ' is not measured per request; the engine''s own metrics put it at '
                || _ms(eng_ms) || ' per request on average over ' || _n(eng_n) || ' requests in the window ('
                || eng_series || ') = ' || _pct(eng_share) || ' of mean e2e (' || _ms(e2e_mean_ms)
                || '): a window aggregate, not a per-request measurement'
            WHEN NOT measured THEN component || ' is not measured in this trace ('
                || CASE component
                    WHEN 'network' THEN 'needs client.request and server.request spans of the same request'
                    WHEN 'frontend' THEN 'needs a server whose spans are its engine''s (server_scope engine), '
                        || 'a client.request and a timed TCP handshake'
                    WHEN 'other' THEN 'needs server.request spans'
                    ELSE 'no ' || component || ' spans' END || '): unknown, not zero'
            ELSE component || ' holds ' || _pct(share) || ' of e2e (' || _ms(ms) || ' per request)'
                || CASE WHEN is_bottleneck THEN ', the largest component'
                        ELSE '; the bottleneck is ' || coalesce(bottleneck, '–') || ' at ' || _pct(bottleneck_share) END
                || CASE WHEN key = 'network' AND ne_basis = 'rtt-split' AND frontend_ms IS NOT NULL
                        THEN '; network here is a round trip (the shortest TCP handshake) per request and per '
                        || 'handshake it opened, and the server''s frontend holds ' || _ms(frontend_ms)
                        || ' per request (' || _pct(frontend_share) || ') outside its engine''s span: server time, not network'
                    WHEN key = 'network' AND ne_basis = 'rtt-split'
                        THEN '; network here is a round trip (the shortest TCP handshake) per request and per '
                        || 'handshake it opened; the server''s time outside the phases it reported is other ('
                        || _ms(other_ms) || ' per request): server time, not network'
                    ELSE '' END
        END AS detail
    FROM j
)
SELECT ordinal, claim, CAST(NULL AS VARCHAR) AS scope, key, component, verdict, share, basis, detail
FROM v
UNION ALL
-- claims about a tail: the component's share of the gap at that tail (module tail)
SELECT q.ordinal, q.claim, q.scope_level || '-' || q.scope_metric, q.key, q.tail_component,
    CASE WHEN s.level IS NULL OR g.n < t.tail_min_requests OR NOT coalesce(c.measured, false) THEN 'unmeasured'
         WHEN c.gap_share = top.share OR c.gap_share >= t.supported_share THEN 'supported'
         WHEN c.gap_share < t.misdiagnosis_share THEN 'misdiagnosis'
         ELSE 'contributing' END,
    CASE WHEN g.n >= t.tail_min_requests AND c.measured THEN c.gap_share END,
    CASE WHEN g.n >= t.tail_min_requests AND c.measured THEN 'tail' ELSE 'none' END,
    CASE WHEN g.n IS NULL OR g.n < t.tail_min_requests THEN 'the ' || q.scope_level || ' ' || _tail_metric(q.scope_metric)
            || ' tail has ' || _n(coalesce(g.n, 0)) || CASE WHEN q.scope_metric = 'itl' THEN ' sampled gaps' ELSE ' requests' END
            || ', fewer than tail_min_requests (' || _n(t.tail_min_requests)
            || '): too few to say where its time went'
         WHEN NOT coalesce(c.measured, false) THEN q.tail_component || ' is not measured per request in this trace: '
            || 'unknown, not zero; the ' || q.scope_level || ' ' || _tail_metric(q.scope_metric) || ' tail''s extra '
            || _ms(g.gap_ms) || ' is ' || coalesce(s2.components_text, 'in no measured component')
         ELSE q.scope_level || ' ' || _tail_metric(q.scope_metric) || ': the ' || _n(g.n) || CASE WHEN q.scope_metric = 'itl' THEN ' gaps' ELSE ' requests' END || ' above '
            || _ms(g.lo_ms) || ' take ' || _ms(g.gap_ms) || ' more than the ' || _n(ty.n) || ' typical ones (p40-p60, mean '
            || _ms(ty.mean_ms) || '); ' || q.tail_component || ' holds ' || _ms(c.delta_ms) || ' of it = ' || _pct(c.gap_share)
            || CASE WHEN c.gap_share = top.share THEN ', the most of any component'
                ELSE '; the most is ' || top.component || ' at ' || _pct(top.share) END END
FROM _claims AS q
CROSS JOIN _thresholds AS t
LEFT JOIN tail_summary AS s ON s.metric = q.scope_metric
LEFT JOIN tail_summary AS s2 ON s2.metric = q.scope_metric AND s2.level = q.scope_level
LEFT JOIN tail_groups AS g ON g.metric = q.scope_metric AND g.level = q.scope_level
LEFT JOIN tail_groups AS ty ON ty.metric = q.scope_metric AND ty.level = 'typical'
LEFT JOIN tail_components AS c ON c.metric = q.scope_metric AND c.level = q.scope_level AND c.component = q.tail_component
LEFT JOIN (SELECT metric, level, arg_max(component, gap_share) AS component, max(gap_share) AS share
           FROM tail_components WHERE measured AND component <> 'unattributed' GROUP BY metric, level) AS top
    ON top.metric = q.scope_metric AND top.level = q.scope_level
WHERE q.scope_metric IS NOT NULL
ORDER BY ordinal;
