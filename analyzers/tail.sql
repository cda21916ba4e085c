-- Module tail: the requests above p95 and above p99 against the typical ones (p40 to p60) for
-- TTFT, e2e and TPOT, and the slowest ITL gaps against typical gaps (docs/domain.md §8): which
-- components make up the difference, and what the tail requests have in common.
--
-- Components per metric: e2e has the eleven of the attribution rule; TTFT those a request passes
-- before its first token (client_queue to prefill; network and frontend whole, as their parts after
-- the first token cannot be told apart); ITL the parts of the step accounting per gap (module steps:
-- own step, co-scheduled prefill, other decode, engine gap, no step; where ITL is measured on the
-- client, client_side, the client's gap beyond the server's); TPOT the time preempted (no step) per
-- decode token, the rest of a request's decode not being split per request (that would take a pass
-- over the tokens grouped by request, a third more on a 10M-token trace; the ITL tail splits gaps). A group's component is its mean per member, a member that did not measure
-- it counting 0; a component no request measured is not measured (null), never 0. What the measured
-- components leave of the metric is `unattributed`, so the differences add up to the gap.
--
-- Features are what the trace holds about each request (tail_requests); each is compared between
-- the tail and the typical requests with the ratio of means, the medians, Cliff's delta
-- (P(tail > typical) - P(tail < typical)) and a Mann-Whitney p-value (normal approximation with
-- ties, Bonferroni-adjusted over the features compared), with the group sizes.
--
-- ITL gaps come from the one ordered pass (tokens._tokens_gap_pass): every gap up to tail_itl_sample
-- decode tokens, a deterministic 1-in-N sample beyond (the groups are then the sampled gaps in them).

-- A number of a feature or a part in text: counts and tokens whole, small values to 2 decimals.
CREATE OR REPLACE MACRO _tail_num(x) AS CASE WHEN abs(x) >= 100 THEN _n(x) WHEN abs(x) >= 10 THEN _f(x, 1)
    ELSE _f(x, 2) END;
CREATE OR REPLACE MACRO _tail_metric(m) AS CASE m WHEN 'ttft' THEN 'TTFT' WHEN 'tpot' THEN 'TPOT'
    WHEN 'itl' THEN 'ITL' ELSE m END;

-- The components of each metric, in order; 99 is what they leave (the one list of decode parts).
CREATE OR REPLACE TEMP TABLE _tail_parts AS
SELECT 'e2e' AS metric, ordinal, component FROM _attribution_components
UNION ALL
SELECT 'ttft', ordinal, component FROM _attribution_components
WHERE ordinal <= (SELECT ordinal FROM _attribution_components WHERE component = 'prefill')
UNION ALL
SELECT 'itl', p.ordinal, p.component
FROM (VALUES (0, 'own_step'), (1, 'prefill'), (2, 'other_decode'), (3, 'engine_gap'), (4, 'no_step'), (5, 'client_side'))
    AS p(ordinal, component)
UNION ALL SELECT 'tpot', 4, 'no_step'
UNION ALL SELECT m.metric, 99, 'unattributed' FROM (VALUES ('e2e'), ('ttft'), ('tpot'), ('itl')) AS m(metric);

-- @table tail_requests
-- One row per successful request with an e2e: TTFT, e2e and TPOT, its decode time per token split as
-- the step accounting splits it, and the features the tail is compared on (null = not measured).
-- @column trace: Trace label.
-- @column request_id: Request id.
-- @column request_key: Integer key of the request's tokens; null without tokens.
-- @column ttft_ms: Time to first token, milliseconds.
-- @column e2e_ms: End-to-end latency, milliseconds.
-- @column tpot_ms: Time per output token after the first, milliseconds.
-- @column no_step_ms: Per decode token, time preempted (no step while the engine kept stepping), milliseconds; null without a steps table.
-- @column arrival_clock: 'client' (the request has client.request) or 'server': the clock of arrival_ns.
-- @column arrival_ns: Arrival, nanoseconds on arrival_clock: the intended send time (client.queue start), else client.request start, else the server start.
-- @column prompt_tokens: Feature: prompt length, tokens.
-- @column output_tokens: Feature: tokens generated (count).
-- @column arrival_s: Feature: arrival, seconds after the first arrival of its trace on that clock.
-- @column arrivals_1s: Feature: other requests of its trace that arrived in the second before it, itself excluded (count).
-- @column in_flight: Feature: other successful requests of its trace in flight (arrived, not finished) when it arrived (count).
-- @column engine_waiting: Feature: requests the engine had waiting at its last scrape at or before the arrival (count); null without engine metrics on the arrival's clock.
-- @column replica: Feature: the trace label's first path segment: the replica in a dataset (server=a), else the trace.
-- @column new_connection: Feature: 1 when the request opened a connection (client.connect), else 0; null when its trace times no connection.
-- @column retried: Feature: 1 when the request was retried (client.retry), else 0; null without a client.request.
-- @column preemptions: Feature: times it was preempted (no step for preemption_min_steps decode iterations) (count); null without a steps table.
-- @column co_prefill_tokens: Feature: prompt tokens the engine prefilled in the iterations from its first decode step to its last, its own excluded (other requests' prefill co-scheduled with its decode) (count); null without step times and a steps table.
-- @column cached_share: Feature: prompt tokens served from the prefix cache over prompt tokens, 0..1; null when not reported.
-- @column client_lag_share: Feature: share of the request's time (arrival to end) that the load client's event loop was stalled (client.loop_lag), 0..1: a share, as a long request overlaps more stalls by its length alone; null when its trace has none.
CREATE OR REPLACE TEMP TABLE tail_requests AS
WITH a AS (
    SELECT trace, request_id, request_key, ttft_ms, e2e_ms, tpot_ms, output_tokens, prompt_tokens, start_ns, end_ns
    FROM attribution_requests WHERE ok AND e2e_ms IS NOT NULL
),
sp AS (
    SELECT trace, request_id,
        coalesce(min(start_ns) FILTER (WHERE name = 'client.queue'),
                 min(start_ns) FILTER (WHERE name = 'client.request')) AS c_start,
        max(end_ns) FILTER (WHERE name = 'client.request') AS c_end,
        count(*) FILTER (WHERE name = 'client.connect') AS connects,
        count(*) FILTER (WHERE name = 'client.retry') AS retries
    FROM spans WHERE request_id <> '' AND clock = 'client' GROUP BY trace, request_id
),
tr AS (
    SELECT trace, count(*) FILTER (WHERE name = 'client.connect' AND request_id <> '') > 0 AS has_connect,
        count(*) FILTER (WHERE name = 'client.loop_lag') > 0 AS has_lag
    FROM spans GROUP BY trace
),
rq AS (SELECT trace, request_id, max(cached_prompt_tokens) AS cached FROM requests GROUP BY trace, request_id),
r AS (
    SELECT a.*, sp.connects, sp.retries, tr.has_connect, tr.has_lag, rq.cached,
        CASE WHEN sp.c_start IS NOT NULL AND sp.c_end IS NOT NULL THEN 'client' ELSE 'server' END AS arrival_clock,
        CASE WHEN sp.c_start IS NOT NULL AND sp.c_end IS NOT NULL THEN sp.c_start ELSE a.start_ns END AS arrival_ns,
        CASE WHEN sp.c_start IS NOT NULL AND sp.c_end IS NOT NULL THEN sp.c_end ELSE a.end_ns END AS done_ns,
        st.stalls, st.no_step_ms, sf.cum_prefill_tokens AS _pt_first, sl.cum_prefill_tokens AS _pt_last
    FROM a
    LEFT JOIN sp USING (trace, request_id)
    LEFT JOIN tr USING (trace)
    LEFT JOIN rq USING (trace, request_id)
    LEFT JOIN (SELECT request_key, count(*) AS stalls, sum(no_step_ms) AS no_step_ms
               FROM (SELECT unnest(stalls, recursive := true) FROM _tokens_gap_pass) AS x GROUP BY request_key) AS st
        ON st.request_key = a.request_key
    LEFT JOIN tokens_requests AS tk ON tk.request_key = a.request_key
    LEFT JOIN _steps_seq AS sf ON sf.trace = a.trace AND sf.start_ns = tk.first_step_start_ns
    LEFT JOIN _steps_seq AS sl ON sl.trace = a.trace AND sl.start_ns = tk.last_step_start_ns
),
-- whether preemption can be seen: the step accounting found forward passes in a steps table
pr AS (SELECT coalesce(step_match_min <= 1, false) AS seen FROM tokens_gap_stats),
-- requests in flight at each arrival: a running count of arrivals (+1) and ends (-1), ends first at a tie
ev AS (
    SELECT trace, arrival_clock, request_id, arrival_ns AS ts, 1 AS d FROM r WHERE arrival_ns IS NOT NULL
    UNION ALL
    SELECT trace, arrival_clock, request_id, done_ns, -1 FROM r WHERE arrival_ns IS NOT NULL AND done_ns IS NOT NULL
),
fl AS (
    SELECT trace, request_id, c - 1 AS in_flight FROM (
        SELECT trace, request_id, d, sum(d) OVER (PARTITION BY trace, arrival_clock ORDER BY ts, d, request_id
                                                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS c
        FROM ev) AS x
    WHERE d = 1
),
bu AS (
    SELECT trace, request_id,
        count(*) OVER (PARTITION BY trace, arrival_clock ORDER BY arrival_ns
                       RANGE BETWEEN 1000000000 PRECEDING AND CURRENT ROW) - 1 AS arrivals_1s,
        (arrival_ns - min(arrival_ns) OVER (PARTITION BY trace, arrival_clock)) / 1e9 AS arrival_s
    FROM r WHERE arrival_ns IS NOT NULL
),
-- the engine's waiting requests at the last scrape at or before each arrival on the metrics' clock: a
-- running maximum of scrape times over scrapes and arrivals in time order (scrapes first at a tie)
sc AS (SELECT trace, ts_ns, requests_waiting FROM engine_timeline WHERE requests_waiting IS NOT NULL),
ew AS (
    SELECT x.trace, x.request_id, sc.requests_waiting AS engine_waiting FROM (
        SELECT trace, request_id, max(scrape_ns) OVER (PARTITION BY trace ORDER BY ts, request_id NULLS FIRST
                                                      ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS at_ns
        FROM (SELECT trace, ts_ns AS ts, ts_ns AS scrape_ns, NULL AS request_id FROM sc
              UNION ALL
              SELECT r.trace, r.arrival_ns, NULL, r.request_id FROM r
              JOIN engine_window AS w ON w.trace = r.trace AND w.clock = r.arrival_clock
              WHERE r.arrival_ns IS NOT NULL) AS u) AS x
    JOIN sc ON sc.trace = x.trace AND sc.ts_ns = x.at_ns
    WHERE x.request_id IS NOT NULL
),
lag AS (
    SELECT r.trace, r.request_id, sum(least(l.end_ns, r.done_ns) - greatest(l.start_ns, r.arrival_ns)) / 1e6 AS lag_ms
    FROM r JOIN spans AS l ON l.trace = r.trace AND l.name = 'client.loop_lag'
        AND l.start_ns < r.done_ns AND l.end_ns > r.arrival_ns
    WHERE r.arrival_clock = 'client'
    GROUP BY r.trace, r.request_id
)
SELECT r.trace, r.request_id, r.request_key, r.ttft_ms, r.e2e_ms, r.tpot_ms,
    CASE WHEN pr.seen AND r.output_tokens >= 2 THEN coalesce(r.no_step_ms, 0) / (r.output_tokens - 1) END AS no_step_ms,
    r.arrival_clock, r.arrival_ns,
    r.prompt_tokens, r.output_tokens, bu.arrival_s, bu.arrivals_1s, fl.in_flight, ew.engine_waiting,
    split_part(r.trace, '/', 1) AS replica,
    CASE WHEN r.has_connect AND r.arrival_clock = 'client' THEN CASE WHEN r.connects > 0 THEN 1 ELSE 0 END END
        AS new_connection,
    CASE WHEN r.arrival_clock = 'client' THEN CASE WHEN r.retries > 0 THEN 1 ELSE 0 END END AS retried,
    CASE WHEN pr.seen THEN coalesce(r.stalls, 0) END AS preemptions,
    r._pt_last - r._pt_first AS co_prefill_tokens,
    r.cached / nullif(r.prompt_tokens, 0) AS cached_share,
    CASE WHEN r.has_lag AND r.arrival_clock = 'client' AND r.done_ns > r.arrival_ns
        THEN coalesce(lag.lag_ms, 0) * 1e6 / (r.done_ns - r.arrival_ns) END AS client_lag_share
FROM r
CROSS JOIN pr
LEFT JOIN bu USING (trace, request_id)
LEFT JOIN fl USING (trace, request_id)
LEFT JOIN ew USING (trace, request_id)
LEFT JOIN lag USING (trace, request_id);

-- Each request's metrics as rows, and the percentiles that cut them into groups (ITL: the tokens'
-- own percentiles, tokens_gap_stats, over every emission).
CREATE OR REPLACE TEMP TABLE _tail_values AS
SELECT trace, request_id, 'ttft' AS metric, ttft_ms AS v FROM tail_requests WHERE ttft_ms IS NOT NULL
UNION ALL SELECT trace, request_id, 'e2e', e2e_ms FROM tail_requests
UNION ALL SELECT trace, request_id, 'tpot', tpot_ms FROM tail_requests WHERE tpot_ms IS NOT NULL;

CREATE OR REPLACE TEMP TABLE _tail_cuts AS
SELECT metric, count(*) AS n, quantile_cont(v, [0.4, 0.6, 0.95, 0.99]) AS q FROM _tail_values GROUP BY metric
UNION ALL
SELECT 'itl', gaps, [itl_p40_ms, itl_p60_ms, itl_p95_ms, itl_p99_ms] FROM tokens_gap_stats WHERE gaps > 0;

-- The groups' members: typical (p40 to p60), above p95, above p99.
CREATE OR REPLACE TEMP TABLE _tail_members AS
SELECT v.metric, l.level, v.trace, v.request_id, v.v
FROM _tail_values AS v JOIN _tail_cuts AS c USING (metric)
CROSS JOIN (VALUES ('typical'), ('p95'), ('p99')) AS l(level)
WHERE CASE l.level WHEN 'typical' THEN v.v >= c.q[1] AND v.v <= c.q[2]
                   WHEN 'p95' THEN v.v > c.q[3] ELSE v.v > c.q[4] END;

-- The sampled ITL gaps in those groups, with their parts as rows.
CREATE OR REPLACE TEMP TABLE _tail_gaps AS
WITH g AS (
    SELECT *, greatest(server_itl_ms - own_ms, 0) AS _wait, flags % 2 = 1 AS first_gap, (flags // 2) % 2 = 1 AS _pre,
        (flags // 4) % 2 = 1 AS _own, flags >= 8 AS _client
    FROM (SELECT unnest(sampled_gaps, recursive := true) FROM _tokens_gap_pass) AS x
),
w AS (  -- as steps_emissions splits a gap: prefill waits, then other decode, the rest engine gap; all of it when preempted
    SELECT *, CASE WHEN _pre THEN 0 ELSE least(greatest(coalesce(between_prefill_ms, 0), 0), _wait) END AS _pw
    FROM g
)
SELECT itl_ms, first_gap,
    CASE WHEN _own THEN own_ms - slowed_ms END AS own_ms,
    CASE WHEN _own THEN _pw + slowed_ms END AS prefill_ms,
    CASE WHEN _own THEN CASE WHEN _pre THEN 0 ELSE least(greatest(coalesce(between_other_ms, 0), 0), _wait - _pw) END END
        AS other_decode_ms,
    CASE WHEN _own THEN _wait - _pw - CASE WHEN _pre THEN _wait
        ELSE least(greatest(coalesce(between_other_ms, 0), 0), _wait - _pw) END END AS engine_gap_ms,
    CASE WHEN _own THEN CASE WHEN _pre THEN _wait ELSE 0 END END AS no_step_ms,
    CASE WHEN _client THEN itl_ms - server_itl_ms END AS client_side_ms
FROM w;

CREATE OR REPLACE TEMP TABLE _tail_gap_long AS
SELECT l.level, g.itl_ms, g.first_gap, p.ordinal,
    CASE p.ordinal WHEN 0 THEN g.own_ms WHEN 1 THEN g.prefill_ms WHEN 2 THEN g.other_decode_ms
        WHEN 3 THEN g.engine_gap_ms WHEN 4 THEN g.no_step_ms WHEN 5 THEN g.client_side_ms END AS ms
FROM _tail_gaps AS g
JOIN _tail_cuts AS c ON c.metric = 'itl'
CROSS JOIN (VALUES ('typical'), ('p95'), ('p99')) AS l(level)
JOIN _tail_parts AS p ON p.metric = 'itl' AND p.ordinal < 99
WHERE CASE l.level WHEN 'typical' THEN g.itl_ms >= c.q[1] AND g.itl_ms <= c.q[2]
                   WHEN 'p95' THEN g.itl_ms > c.q[3] ELSE g.itl_ms > c.q[4] END;

-- @table tail_groups
-- One row per metric (ttft, e2e, tpot, itl) and group: the typical requests (p40 to p60) and those
-- above p95 and above p99 (for itl: sampled gaps). Groups without a member have no row.
-- @column metric: 'ttft', 'e2e', 'tpot' or 'itl'.
-- @column level: 'typical', 'p95' or 'p99'.
-- @column lo_ms: The group's lower bound, milliseconds: p40 for typical (inclusive), the percentile for a tail (exclusive).
-- @column hi_ms: The group's upper bound, milliseconds: p60 for typical; null for a tail.
-- @column n: Members: requests, or for itl gaps of the sample (count).
-- @column sampled_every: 1 when every request (gap) is a member; for itl, N when 1 gap in N was sampled (beyond tail_itl_sample decode tokens).
-- @column mean_ms: The metric's mean over the group, milliseconds.
-- @column gap_ms: mean_ms minus the typical group's mean, milliseconds (null for typical).
-- @column first_gap_share: itl: share of the group's gaps that are their request's first gap after token 0, 0..1 (the request's own phase); null for other metrics.
-- @column with_prefill_share: itl: share of the group's gaps that waited through or shared a step with prefill work, 0..1; null without step times or for other metrics.
-- @column preempted_share: itl: share of the group's gaps that were preemption stalls, 0..1; null without a steps table or for other metrics.
CREATE OR REPLACE TEMP TABLE tail_groups AS
WITH req AS (
    SELECT metric, level, count(*) AS n, 1 AS sampled_every, favg(v) AS mean_ms, NULL::DOUBLE AS first_gap_share,
        NULL::DOUBLE AS with_prefill_share, NULL::DOUBLE AS preempted_share
    FROM _tail_members GROUP BY metric, level
),
gap AS (
    SELECT 'itl' AS metric, level, count(*) AS n,
        (SELECT greatest(ceil(coalesce(sum(decode_tokens), 0) / any_value(t.tail_itl_sample)), 1)::BIGINT
         FROM tokens_requests, _thresholds AS t WHERE NOT failed) AS sampled_every,
        favg(itl_ms) AS mean_ms, avg(CASE WHEN first_gap THEN 1.0 ELSE 0.0 END)::DOUBLE AS first_gap_share,
        CASE WHEN count(own_ms) > 0 THEN avg(CASE WHEN prefill_ms > 0 THEN 1.0 ELSE 0.0 END)::DOUBLE END AS with_prefill_share,
        CASE WHEN count(own_ms) > 0 THEN avg(CASE WHEN no_step_ms > 0 THEN 1.0 ELSE 0.0 END)::DOUBLE END AS preempted_share
    FROM (SELECT l.level, g.* FROM _tail_gaps AS g JOIN _tail_cuts AS c ON c.metric = 'itl'
          CROSS JOIN (VALUES ('typical'), ('p95'), ('p99')) AS l(level)
          WHERE CASE l.level WHEN 'typical' THEN g.itl_ms >= c.q[1] AND g.itl_ms <= c.q[2]
                             WHEN 'p95' THEN g.itl_ms > c.q[3] ELSE g.itl_ms > c.q[4] END) AS x
    GROUP BY level
),
u AS (SELECT * FROM req UNION ALL SELECT * FROM gap)
SELECT u.metric, u.level,
    CASE u.level WHEN 'typical' THEN c.q[1] WHEN 'p95' THEN c.q[3] ELSE c.q[4] END AS lo_ms,
    CASE WHEN u.level = 'typical' THEN c.q[2] END AS hi_ms,
    u.n, u.sampled_every, u.mean_ms,
    CASE WHEN u.level <> 'typical' THEN u.mean_ms - t.mean_ms END AS gap_ms,
    u.first_gap_share, u.with_prefill_share, u.preempted_share
FROM u JOIN _tail_cuts AS c USING (metric)
LEFT JOIN u AS t ON t.metric = u.metric AND t.level = 'typical'
ORDER BY CASE u.metric WHEN 'ttft' THEN 1 WHEN 'e2e' THEN 2 WHEN 'tpot' THEN 3 ELSE 4 END,
    CASE u.level WHEN 'typical' THEN 1 WHEN 'p95' THEN 2 ELSE 3 END;

-- Each request's components per metric as rows (ms null = not measured by that request).
CREATE OR REPLACE TEMP TABLE _tail_long AS
SELECT l.trace, l.request_id, p.metric, p.ordinal, l.ms
FROM _attribution_long AS l JOIN _tail_parts AS p ON p.ordinal = l.ordinal AND p.metric IN ('e2e', 'ttft')
WHERE l.ok AND l.e2e_ms IS NOT NULL
UNION ALL
SELECT trace, request_id, 'tpot', 4, no_step_ms FROM tail_requests WHERE tpot_ms IS NOT NULL;

-- @table tail_components
-- One row per metric, tail level (p95, p99) and component: its mean per member in the typical group
-- and in the tail, the difference, and its share of the gap between the two groups' means. The
-- shares of a metric and level add up to 1 with `unattributed`.
-- @column metric: 'ttft', 'e2e', 'tpot' or 'itl'.
-- @column level: 'p95' or 'p99': the tail compared with the typical group.
-- @column ordinal: Position of the component (the attribution's order; decode parts 0-5; 99 unattributed).
-- @column component: Component or decode part (own_step, prefill, other_decode, engine_gap, no_step, client_side), or unattributed (what the measured ones leave of the metric).
-- @column measured: False when no request (gap) measured it: its figures are null, unknown, not zero.
-- @column typical_ms: Mean per member of the typical group (a member that did not measure it counts 0), milliseconds.
-- @column tail_ms: Mean per member of the tail, milliseconds.
-- @column delta_ms: tail_ms minus typical_ms, milliseconds.
-- @column gap_share: delta_ms over the gap between the tail's and the typical group's means of the metric, as a fraction (0..1 when every part grows; negative for a part that shrank).
-- @column text: The row in words with its numbers (what findings and claims quote).
CREATE OR REPLACE TEMP TABLE tail_components AS
WITH s AS (
    SELECT m.metric, m.level, l.ordinal, fsum(l.ms) AS total
    FROM _tail_members AS m JOIN _tail_long AS l USING (metric, trace, request_id)
    GROUP BY m.metric, m.level, l.ordinal
    UNION ALL
    SELECT 'itl', level, ordinal, fsum(ms) FROM _tail_gap_long GROUP BY level, ordinal
),
me AS (
    SELECT metric, ordinal, count(ms) > 0 AS measured FROM _tail_long GROUP BY metric, ordinal
    UNION ALL
    SELECT 'itl', ordinal, count(ms) > 0 FROM _tail_gap_long GROUP BY ordinal
),
c AS (
    SELECT p.metric, l.level, p.ordinal, p.component, coalesce(me.measured, false) AS measured,
        CASE WHEN me.measured THEN coalesce(st.total, 0) / gt.n END AS typical_ms,
        CASE WHEN me.measured THEN coalesce(sl.total, 0) / gl.n END AS tail_ms,
        gt.mean_ms AS typical_mean, gl.mean_ms AS tail_mean
    FROM _tail_parts AS p
    CROSS JOIN (VALUES ('p95'), ('p99')) AS l(level)
    JOIN tail_groups AS gl ON gl.metric = p.metric AND gl.level = l.level
    JOIN tail_groups AS gt ON gt.metric = p.metric AND gt.level = 'typical'
    LEFT JOIN me ON me.metric = p.metric AND me.ordinal = p.ordinal
    LEFT JOIN s AS sl ON sl.metric = p.metric AND sl.level = l.level AND sl.ordinal = p.ordinal
    LEFT JOIN s AS st ON st.metric = p.metric AND st.level = 'typical' AND st.ordinal = p.ordinal
    WHERE p.ordinal < 99
),
u AS (
    SELECT metric, level, ordinal, component, measured, typical_ms, tail_ms, typical_mean, tail_mean FROM c
    UNION ALL
    -- to the nanosecond: a sum's last bits depend on the order the plan adds in, and a session's plan is not
    -- a fresh connection's
    SELECT metric, level, 99, 'unattributed', true, round(max(typical_mean) - coalesce(sum(typical_ms), 0), 6),
        round(max(tail_mean) - coalesce(sum(tail_ms), 0), 6), max(typical_mean), max(tail_mean)
    FROM c GROUP BY metric, level
)
SELECT metric, level, ordinal, component, measured, typical_ms, tail_ms, tail_ms - typical_ms AS delta_ms,
    (tail_ms - typical_ms) / nullif(tail_mean - typical_mean, 0) AS gap_share,
    CASE WHEN measured THEN component || ' ' || _ms(tail_ms) || CASE metric WHEN 'itl' THEN ' per slow gap'
        WHEN 'tpot' THEN ' per decode token of the tail' ELSE ' per tail request' END || ' against ' || _ms(typical_ms)
        || ' typical = ' || _pct((tail_ms - typical_ms) / nullif(tail_mean - typical_mean, 0)) || ' of the gap'
        ELSE component || ' not measured' END AS text
FROM u
ORDER BY CASE metric WHEN 'ttft' THEN 1 WHEN 'e2e' THEN 2 WHEN 'tpot' THEN 3 ELSE 4 END, level, ordinal;

-- The features compared, in order (the one list of them): name, what it is in words, and whether it
-- is a share (binary: the group's mean is the share of members that have it) or a number.
CREATE OR REPLACE TEMP TABLE _tail_feature_names AS
SELECT * FROM (VALUES
    (1, 'prompt_tokens', 'prompt tokens', 'number'),
    (2, 'output_tokens', 'output tokens', 'number'),
    (3, 'arrival_s', 'arrival (s into the run)', 'number'),
    (4, 'arrivals_1s', 'arrivals in the second before', 'number'),
    (5, 'in_flight', 'requests in flight at arrival', 'number'),
    (6, 'engine_waiting', 'requests waiting in the engine at arrival', 'number'),
    (7, 'new_connection', 'a new connection', 'share'),
    (8, 'retried', 'retried', 'share'),
    (9, 'preemptions', 'preemptions', 'number'),
    (10, 'co_prefill_tokens', 'prefill tokens co-scheduled with its decode', 'number'),
    (11, 'cached_share', 'prompt share from the prefix cache', 'number'),
    (12, 'client_lag_share', 'share of the request in load-client loop stalls', 'number')
) AS v(ordinal, feature, label, kind);

-- Each request's features as rows; the replica as one 0/1 feature per replica when there are several.
CREATE OR REPLACE TEMP TABLE _tail_feature_values AS
SELECT * FROM (
    SELECT r.trace, r.request_id, f.ordinal, f.feature, CASE f.ordinal
            WHEN 1 THEN r.prompt_tokens WHEN 2 THEN r.output_tokens WHEN 3 THEN r.arrival_s WHEN 4 THEN r.arrivals_1s
            WHEN 5 THEN r.in_flight WHEN 6 THEN r.engine_waiting WHEN 7 THEN r.new_connection WHEN 8 THEN r.retried
            WHEN 9 THEN r.preemptions WHEN 10 THEN r.co_prefill_tokens WHEN 11 THEN r.cached_share
            WHEN 12 THEN r.client_lag_share END::DOUBLE AS value
    FROM tail_requests AS r CROSS JOIN _tail_feature_names AS f
) AS x WHERE value IS NOT NULL
UNION ALL
SELECT r.trace, r.request_id, 100, 'replica=' || g.replica, CASE WHEN r.replica = g.replica THEN 1.0 ELSE 0.0 END
FROM tail_requests AS r
CROSS JOIN (SELECT DISTINCT replica FROM tail_requests) AS g
WHERE (SELECT count(DISTINCT replica) FROM tail_requests) > 1;

-- The upper tail of the standard normal distribution, Q(z) = erfc(z / sqrt 2) / 2, by Abramowitz and
-- Stegun 7.1.26 (absolute error below 1e-7): for the Mann-Whitney p-values.
CREATE OR REPLACE MACRO _tail_normal_sf(z) AS CASE WHEN z < 0 THEN 1.0 ELSE
    0.5 * (1.0 / (1.0 + 0.3275911 * z / sqrt(2.0))) * (0.254829592 + (1.0 / (1.0 + 0.3275911 * z / sqrt(2.0)))
        * (-0.284496736 + (1.0 / (1.0 + 0.3275911 * z / sqrt(2.0))) * (1.421413741 + (1.0 / (1.0 + 0.3275911 * z / sqrt(2.0)))
        * (-1.453152027 + (1.0 / (1.0 + 0.3275911 * z / sqrt(2.0))) * 1.061405429)))) * exp(-z * z / 2.0) END;

-- @table tail_features
-- One row per metric, tail level and feature: the feature in the tail against the typical requests,
-- with effect sizes and group sizes (requests where the feature is measured).
-- @column metric: 'ttft', 'e2e' or 'tpot'.
-- @column level: 'p95' or 'p99'.
-- @column ordinal: Position of the feature (_tail_feature_names; 100 for a replica).
-- @column feature: Feature name (a column of tail_requests), or replica=NAME (1 for that replica's requests).
-- @column label: The feature in words.
-- @column kind: 'share' (0/1: the means are the share of members that have it) or 'number'.
-- @column tail_n: Tail requests with the feature measured (count).
-- @column typical_n: Typical requests with the feature measured (count).
-- @column tail_mean: The feature's mean over the tail (a share for kind share).
-- @column typical_mean: Its mean over the typical requests.
-- @column tail_median: Its median over the tail.
-- @column typical_median: Its median over the typical requests.
-- @column ratio: tail_mean over typical_mean (null when the typical mean is 0).
-- @column cliffs_delta: Cliff's delta, P(tail > typical) - P(tail < typical), -1..1 (for a share: the difference of the shares).
-- @column p_value: Two-sided Mann-Whitney p-value (normal approximation, ties corrected), Bonferroni-adjusted over the features compared at this metric and level, 0..1.
-- @column separates: True when abs(cliffs_delta) is at least tail_effect_size, p_value below tail_significance and the tail has at least tail_min_requests requests.
-- @column rank: Order of the features by separation (separating first, then by abs(cliffs_delta)).
-- @column text: The row in words with its numbers and group sizes (what the summary and findings quote).
CREATE OR REPLACE TEMP TABLE tail_features AS
WITH y AS (
    SELECT l.level, m.metric, f.ordinal, f.feature, f.value, m.level = l.level AS in_tail
    FROM _tail_members AS m
    JOIN _tail_feature_values AS f USING (trace, request_id)
    JOIN (VALUES ('p95'), ('p99')) AS l(level) ON m.level IN (l.level, 'typical')
),
-- per distinct value, its count in each group and the typical members below it: the Mann-Whitney U of
-- the tail (pairs it wins, ties counting half) and the tie correction, without ranking every member
v AS (
    SELECT metric, level, feature, value, min(ordinal) AS ordinal,
        count(*) FILTER (WHERE in_tail) AS n1, count(*) FILTER (WHERE NOT in_tail) AS n2
    FROM y GROUP BY metric, level, feature, value
),
w AS (
    SELECT *, coalesce(sum(n2) OVER (PARTITION BY metric, level, feature ORDER BY value
                                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS below2
    FROM v
),
st AS (
    SELECT metric, level, feature, min(ordinal) AS ordinal, sum(n1)::BIGINT AS tail_n, sum(n2)::BIGINT AS typical_n,
        -- as DOUBLE: Spark keeps 0.5 * n a decimal, which its format_string cannot print with %f
        sum(n1 * (below2 + 0.5 * n2))::DOUBLE AS u1, sum((n1 + n2) * (n1 + n2) * (n1 + n2) - (n1 + n2))::DOUBLE AS tc,
        (sum(n1 * value) / nullif(sum(n1), 0))::DOUBLE AS tail_mean, (sum(n2 * value) / nullif(sum(n2), 0))::DOUBLE AS typical_mean
    FROM w GROUP BY metric, level, feature
),
md AS (
    SELECT metric, level, feature, quantile_cont(value, 0.5) FILTER (WHERE in_tail) AS tail_median,
        quantile_cont(value, 0.5) FILTER (WHERE NOT in_tail) AS typical_median
    FROM y GROUP BY metric, level, feature
),
p AS (
    SELECT st.*, md.tail_median, md.typical_median,
        (2.0 * u1 / (tail_n * typical_n) - 1)::DOUBLE AS cliffs_delta, (tail_mean / nullif(typical_mean, 0))::DOUBLE AS ratio_,
        CASE WHEN tail_n * typical_n / 12.0 * ((tail_n + typical_n + 1) - tc / ((tail_n + typical_n) * (tail_n + typical_n - 1.0))) > 0
            THEN least(1.0, 2.0 * _tail_normal_sf(abs(u1 - tail_n * typical_n / 2.0)
                / sqrt(tail_n * typical_n / 12.0 * ((tail_n + typical_n + 1)
                       - tc / ((tail_n + typical_n) * (tail_n + typical_n - 1.0)))))
                * count(*) OVER (PARTITION BY st.metric, st.level)) ELSE 1.0 END AS p_value
    FROM st JOIN md USING (metric, level, feature)
    WHERE tail_n >= 1 AND typical_n >= 1
)
SELECT p.metric, p.level, p.ordinal, p.feature,
    coalesce(n.label, 'replica ' || substr(p.feature, 9)) AS label, coalesce(n.kind, 'share') AS kind,
    p.tail_n, p.typical_n, p.tail_mean, p.typical_mean, p.tail_median, p.typical_median,
    p.ratio_ AS ratio, p.cliffs_delta, p.p_value,
    abs(p.cliffs_delta) >= t.tail_effect_size AND p.p_value < t.tail_significance AND p.tail_n >= t.tail_min_requests
        AS separates,
    row_number() OVER (PARTITION BY p.metric, p.level ORDER BY abs(p.cliffs_delta) >= t.tail_effect_size
        AND p.p_value < t.tail_significance AND p.tail_n >= t.tail_min_requests DESC, abs(p.cliffs_delta) DESC,
        p.ordinal, p.feature) AS rank,
    CASE WHEN coalesce(n.kind, 'share') = 'share' THEN coalesce(n.label, 'replica ' || substr(p.feature, 9)) || ': '
            || _pct(p.tail_mean) || ' of the tail vs ' || _pct(p.typical_mean) || ' of typical requests'
        ELSE n.label || ' median ' || _tail_num(p.tail_median) || ' vs ' || _tail_num(p.typical_median)
            || CASE WHEN p.ratio_ IS NOT NULL THEN ', mean ' || _f(p.ratio_, 1) || 'x' ELSE '' END END
        || ' (Cliff''s delta ' || _f(p.cliffs_delta, 2) || ', ' || p.tail_n || ' vs ' || p.typical_n || ' requests)' AS text
FROM p
LEFT JOIN _tail_feature_names AS n USING (feature)
CROSS JOIN _thresholds AS t
ORDER BY CASE p.metric WHEN 'ttft' THEN 1 WHEN 'e2e' THEN 2 ELSE 3 END, p.level, rank;

-- @table tail_summary
-- One row per metric with a typical group: the tail the analysis explains (above p99 when it has at
-- least tail_min_requests members, else above p95, else none), its gap, where the gap is, and what
-- its requests have in common, in words.
-- @column metric: 'ttft', 'e2e', 'tpot' or 'itl'.
-- @column level: 'p99' or 'p95': the tail explained; null when even the p95 tail has fewer than tail_min_requests members.
-- @column n: Requests (itl: emissions) the percentiles are over (count).
-- @column typical_n: Members of the typical group (count; itl: sampled gaps).
-- @column tail_n: Members of the tail explained, else of the p95 tail (count; itl: sampled gaps).
-- @column threshold_ms: The percentile the tail is above, milliseconds.
-- @column typical_ms: The metric's mean over the typical group, milliseconds.
-- @column tail_ms: Its mean over the tail, milliseconds.
-- @column gap_ms: tail_ms minus typical_ms, milliseconds.
-- @column top_component: The measured component (or part) with the largest share of the gap; unattributed when what no component measured is larger.
-- @column top_share: Its share of the gap, as a fraction (0..1 unless parts shrank).
-- @column separating: Features that separate the tail from the typical requests (count; null for itl).
-- @column components_text: The components that grew, largest first, with their shares of the gap.
-- @column features_text: The features that separate the tail, strongest first (at most three), with effect sizes.
-- @column head: The tail and its typical group in words: sizes, bounds, means and the gap.
-- @column sentence: The tail in one sentence with its numbers.
CREATE OR REPLACE TEMP TABLE tail_summary AS
WITH g AS (
    SELECT t.metric, any_value(c.n) AS n,
        any_value(t.n) FILTER (WHERE t.level = 'typical') AS typical_n,
        any_value(t.mean_ms) FILTER (WHERE t.level = 'typical') AS typical_ms,
        any_value(t.n) FILTER (WHERE t.level = 'p95') AS n95, any_value(t.n) FILTER (WHERE t.level = 'p99') AS n99
    FROM tail_groups AS t JOIN _tail_cuts AS c USING (metric)
    GROUP BY t.metric
),
t AS (
    SELECT g.*, CASE WHEN g.n99 >= th.tail_min_requests THEN 'p99' WHEN g.n95 >= th.tail_min_requests THEN 'p95' END
            AS level, th.tail_min_requests,
        tg.n AS tail_n, tg.lo_ms AS threshold_ms, tg.mean_ms AS tail_ms, tg.gap_ms,
        tg.first_gap_share, tg.with_prefill_share, tg.preempted_share,
        ty.first_gap_share AS ty_first, ty.with_prefill_share AS ty_prefill
    FROM g CROSS JOIN _thresholds AS th
    LEFT JOIN tail_groups AS tg ON tg.metric = g.metric
        AND tg.level = CASE WHEN g.n99 >= th.tail_min_requests THEN 'p99' ELSE 'p95' END
    LEFT JOIN tail_groups AS ty ON ty.metric = g.metric AND ty.level = 'typical'
    WHERE g.typical_n > 0
),
c AS (
    SELECT t.metric,
        arg_max(c.component, c.gap_share) FILTER (WHERE c.measured) AS top_component,
        max(c.gap_share) FILTER (WHERE c.measured) AS top_share,
        string_agg(c.component || ' ' || _pct(c.gap_share), ', ' ORDER BY c.gap_share DESC)
            FILTER (WHERE c.measured AND c.gap_share >= 0.05) AS components_text
    FROM t JOIN tail_components AS c ON c.metric = t.metric AND c.level = t.level
    GROUP BY t.metric
),
f AS (
    SELECT t.metric, count(*) FILTER (WHERE f.separates) AS separating,
        string_agg(f.text, '; ' ORDER BY f.rank) FILTER (WHERE f.separates AND f.rank <= 3) AS features_text
    FROM t JOIN tail_features AS f ON f.metric = t.metric AND f.level = t.level
    GROUP BY t.metric
),
h AS (
    SELECT t.*, c.top_component, c.top_share, c.components_text, f.features_text,
        CASE WHEN t.metric <> 'itl' AND t.level IS NOT NULL THEN coalesce(f.separating, 0) END AS separating,
        CASE WHEN t.metric = 'itl' THEN ' gaps' ELSE ' requests' END AS unit,
        coalesce(t.level, 'p95') || ' ' || _tail_metric(t.metric) || ' (' || _n(t.tail_n)
            || CASE WHEN t.metric = 'itl' THEN ' gap' ELSE ' request' END || CASE WHEN t.tail_n = 1 THEN '' ELSE 's' END
            || ' above ' || _ms(t.threshold_ms) || ', mean '
            || _ms(t.tail_ms) || ', against ' || _n(t.typical_n) || ' typical (p40-p60), mean ' || _ms(t.typical_ms) || ': +'
            || _ms(t.gap_ms) || ')' AS head
    FROM t LEFT JOIN c USING (metric) LEFT JOIN f USING (metric)
)
SELECT metric, level, n, typical_n, tail_n, threshold_ms, typical_ms, tail_ms, gap_ms, top_component, top_share,
    separating, components_text, features_text, head,
    CASE WHEN level IS NULL THEN head || ': fewer than tail_min_requests (' || tail_min_requests::BIGINT || ')'
            || unit || ': too few to say what the tail has in common'
        ELSE head || coalesce(': ' || components_text, '')
            || CASE WHEN metric = 'itl' THEN
                CASE WHEN with_prefill_share IS NOT NULL THEN '; ' || _pct(with_prefill_share) || ' of them waited '
                    || 'through or shared a step with prefill (typical ' || _pct(ty_prefill) || ')'
                    || CASE WHEN preempted_share > 0 THEN ', ' || _pct(preempted_share) || ' were preemption stalls'
                        ELSE '' END
                ELSE '; by phase: ' || _pct(first_gap_share) || ' are their request''s first gap after token 0 (typical '
                    || _pct(ty_first) || ')' END
            WHEN features_text IS NOT NULL THEN '; in common: ' || features_text
            ELSE '; no feature separates them from typical requests: a tail of noise' END
    END AS sentence
FROM h
ORDER BY CASE metric WHEN 'ttft' THEN 1 WHEN 'e2e' THEN 2 WHEN 'tpot' THEN 3 ELSE 4 END;
