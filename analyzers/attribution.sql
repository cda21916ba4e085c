-- Module attribution: where each request's time went, by the attribution rule
-- of docs/trace-format.md, and the shares of e2e per component.
--
-- Per request: e2e = client.request if present (plus client.queue, the time it
-- waited in the load client after its intended send time), else server.request, else (an
-- extension for in-process traces without request spans, e.g. Hugging Face
-- generate) the extent of the request's server-clock spans and tokens.
-- network = client.request - server.request when both exist and server.request covers the
-- whole HTTP request (requests.server_scope 'server', the default), else not measured. Two kinds
-- of server tell less than their whole time, and then the client's time beyond what they say is
-- network AND server time:
--   * server.request is only the engine's span (server_scope 'engine': vLLM's llm_request starts
--     at the engine's arrival, after HTTP handling, the chat template and tokenization, and ends
--     before detokenization and streaming): the rest is the server's frontend;
--   * no server.request, but the server reported phases (llama.cpp's timings, vLLM's per-request
--     metrics): the rest is server time in no named phase (waiting for a slot, HTTP handling, ...),
--     which is other by the rule below.
-- Network is then what the client measured as network: a round trip per request (the request
-- out, the last bytes back) plus one per handshake it opened (client.connect, client.tls), never
-- more than that difference. The round trip is the trace's shortest TCP handshake: a handshake
-- takes at least one round trip, and longer ones also hold the client's own delays (a busy event
-- loop). Without a timed handshake the two are not split: network and frontend (or other) stay
-- null, and the difference is kept as outside_ms.
-- The transfer of the bytes at the link's rate is not added (the trace holds neither the bytes nor
-- the rate): network is round trips only, a lower bound, and the transfer time stays in frontend
-- (or other). On loopback or a LAN that is microseconds: the body of a short chat request and the
-- last chunk of a streamed answer are a few KB at most, 8 us a KB at 1 Gbit/s (the rest of the stream
-- leaves during decode). It matters on a slow link with a long prompt: 400 KB (about 100k tokens)
-- at 10 Mbit/s is 0.3 s, all of it counted as frontend (or other).
-- client_queue = the sum of client.queue spans (client clock); null without them.
-- Each phase = the sum of its spans' durations; a phase without spans is not
-- measured for that request (null), which differs from a measured zero.
-- other = server.request - sum of phases, not below 0; for a server that reported phases but no
-- server.request, its time beyond them less the measured network (above); else null.
-- TTFT is client-side (token 0's client_recv_ns - client.queue start, else
-- client.request start) where the
-- client recorded it, else server-side (token 0's emit_ns - server.request start,
-- or the earliest server span). TPOT = (e2e - TTFT) / (output_tokens - 1), both on
-- the TTFT's side. Failed requests (requests.status = 'error') are kept here but
-- left out of every aggregate.

-- The components of the rule in the order every output lists them (the report's row order, not the
-- serving order: see tracetool.schema.COMPONENTS, which this mirrors;
-- tests/analyzers/test_sql_attribution.py keeps the two equal).
CREATE OR REPLACE TEMP TABLE _attribution_components AS
SELECT * FROM (VALUES (0, 'client_queue'), (1, 'network'), (2, 'frontend'), (3, 'queue'), (4, 'tokenize'),
    (5, 'preprocess'), (6, 'prefill'), (7, 'decode'), (8, 'detokenize'), (9, 'postprocess'), (10, 'other'))
    AS v(ordinal, component);

-- @view attribution_spans
-- Span durations per request and name group: the raw material of the rule.
-- @column trace: Trace label.
-- @column request_id: Request id.
-- @column client_ns: Sum of client.request durations, nanoseconds (client clock).
-- @column client_start_ns: Earliest client.request start, nanoseconds (client clock).
-- @column client_queue_ns: Sum of client.queue durations (intended send to sent), nanoseconds (client clock).
-- @column client_queue_start_ns: Earliest client.queue start: the intended send time, nanoseconds (client clock).
-- @column server_ns: Sum of server.request durations, nanoseconds.
-- @column server_start_ns: Earliest server.request start, nanoseconds (server clock).
-- @column queue_ns: Sum of queue span durations, nanoseconds.
-- @column tokenize_ns: Sum of tokenize span durations, nanoseconds.
-- @column preprocess_ns: Sum of preprocess span durations, nanoseconds.
-- @column prefill_ns: Sum of prefill span durations, nanoseconds.
-- @column decode_ns: Sum of decode span durations, nanoseconds.
-- @column detokenize_ns: Sum of detokenize span durations, nanoseconds.
-- @column postprocess_ns: Sum of postprocess span durations, nanoseconds.
-- @column handshakes: The request's client.connect and client.tls spans: the TCP and TLS handshakes it opened, each a round trip (count).
-- @column first_server_ns: Earliest start of any server-clock span, nanoseconds.
-- @column last_server_ns: Latest end of any server-clock span, nanoseconds.
-- @column other_spans: Spans with names outside the standard ones (count); their time falls in other.
CREATE OR REPLACE VIEW attribution_spans AS
SELECT
    trace,
    request_id,
    sum(end_ns - start_ns) FILTER (WHERE name = 'client.request')::BIGINT AS client_ns,
    min(start_ns) FILTER (WHERE name = 'client.request') AS client_start_ns,
    sum(end_ns - start_ns) FILTER (WHERE name = 'client.queue')::BIGINT AS client_queue_ns,
    min(start_ns) FILTER (WHERE name = 'client.queue') AS client_queue_start_ns,
    sum(end_ns - start_ns) FILTER (WHERE name = 'server.request')::BIGINT AS server_ns,
    min(start_ns) FILTER (WHERE name = 'server.request') AS server_start_ns,
    sum(end_ns - start_ns) FILTER (WHERE name = 'queue')::BIGINT AS queue_ns,
    sum(end_ns - start_ns) FILTER (WHERE name = 'tokenize')::BIGINT AS tokenize_ns,
    sum(end_ns - start_ns) FILTER (WHERE name = 'preprocess')::BIGINT AS preprocess_ns,
    sum(end_ns - start_ns) FILTER (WHERE name = 'prefill')::BIGINT AS prefill_ns,
    sum(end_ns - start_ns) FILTER (WHERE name = 'decode')::BIGINT AS decode_ns,
    sum(end_ns - start_ns) FILTER (WHERE name = 'detokenize')::BIGINT AS detokenize_ns,
    sum(end_ns - start_ns) FILTER (WHERE name = 'postprocess')::BIGINT AS postprocess_ns,
    count(*) FILTER (WHERE name IN ('client.connect', 'client.tls')) AS handshakes,
    min(start_ns) FILTER (WHERE clock = 'server') AS first_server_ns,
    max(end_ns) FILTER (WHERE clock = 'server') AS last_server_ns,
    count(*) FILTER (WHERE name NOT IN ('client.request', 'client.queue', 'server.request', 'queue', 'tokenize',
        'preprocess', 'prefill', 'decode', 'detokenize', 'postprocess')) AS other_spans
FROM spans
WHERE request_id <> ''
GROUP BY trace, request_id;

-- One round trip per trace: the shortest TCP handshake the client timed (see the header).
CREATE OR REPLACE TEMP TABLE _attribution_rtt AS
SELECT trace, min(end_ns - start_ns)::BIGINT AS rtt_ns
FROM spans WHERE name = 'client.connect' GROUP BY trace;

-- attribution_requests without its bottleneck column (below).
CREATE OR REPLACE TEMP TABLE _attribution_base AS
WITH ids AS (
    SELECT trace, request_id FROM attribution_spans
    UNION SELECT trace, request_id FROM tokens_requests
    UNION SELECT trace, request_id FROM requests WHERE request_id <> ''
),
info AS (
    SELECT trace, request_id,
           bool_or(status = 'error') AS failed,
           coalesce(bool_or(server_scope = 'engine'), false) AS engine_scope,
           max(prompt_tokens) AS prompt_tokens,
           max(output_tokens) AS output_tokens
    FROM requests GROUP BY trace, request_id
),
j AS (
    SELECT
        ids.trace, ids.request_id, s.* EXCLUDE (trace, request_id), t.* EXCLUDE (trace, request_id, failed), i.failed, i.prompt_tokens AS info_prompt,
        coalesce(i.engine_scope, false) AS engine_scope, rt.rtt_ns,
        i.output_tokens AS info_output,
        least(s.first_server_ns, t.min_emit_ns) AS start_ns,
        greatest(s.last_server_ns, t.max_emit_ns) AS end_ns,
        (s.queue_ns IS NOT NULL OR s.tokenize_ns IS NOT NULL OR s.preprocess_ns IS NOT NULL
         OR s.prefill_ns IS NOT NULL OR s.decode_ns IS NOT NULL OR s.detokenize_ns IS NOT NULL
         OR s.postprocess_ns IS NOT NULL) AS _any_phase
    FROM ids
    LEFT JOIN attribution_spans AS s USING (trace, request_id)
    LEFT JOIN tokens_requests AS t USING (trace, request_id)
    LEFT JOIN info AS i USING (trace, request_id)
    LEFT JOIN _attribution_rtt AS rt USING (trace)
),
r AS (
    SELECT
        *,
        CASE WHEN client_ns IS NOT NULL THEN client_ns + coalesce(client_queue_ns, 0)
             WHEN server_ns IS NOT NULL THEN server_ns
             WHEN first_server_ns IS NOT NULL THEN end_ns - start_ns END AS _e2e_ns,
        CASE WHEN client_ns IS NOT NULL THEN 'client'
             WHEN server_ns IS NOT NULL THEN 'server'
             WHEN first_server_ns IS NOT NULL THEN 'extent' END AS e2e_source,
        CASE WHEN client_ns IS NOT NULL AND first_recv_ns IS NOT NULL
             THEN first_recv_ns - coalesce(client_queue_start_ns, client_start_ns)
             ELSE first_emit_ns - coalesce(server_start_ns, first_server_ns) END AS _ttft_ns,
        CASE WHEN client_ns IS NOT NULL AND first_recv_ns IS NOT NULL THEN 'client'
             WHEN first_emit_ns IS NOT NULL AND coalesce(server_start_ns, first_server_ns) IS NOT NULL
             THEN 'server' END AS ttft_source,
        -- the requests table's count first: a client's token rows are content chunks, and a chunk
        -- may hold several tokens; the server's usage (written there) counts tokens
        coalesce(info_output, output_tokens) AS _out,
        -- the client's time beyond what the server says it spent (see the header)
        CASE WHEN client_ns IS NULL THEN NULL
             WHEN engine_scope AND server_ns IS NOT NULL THEN client_ns - server_ns
             WHEN server_ns IS NULL AND _any_phase THEN greatest(client_ns - (coalesce(queue_ns, 0)
                 + coalesce(tokenize_ns, 0) + coalesce(preprocess_ns, 0) + coalesce(prefill_ns, 0)
                 + coalesce(decode_ns, 0) + coalesce(detokenize_ns, 0) + coalesce(postprocess_ns, 0)), 0)
        END AS _outside_ns
    FROM j
),
r2 AS (
    SELECT *, greatest(least(_outside_ns, rtt_ns * (1 + coalesce(handshakes, 0))), 0) AS _net_ns FROM r
),
c AS (
    SELECT
        trace, request_id, request_key, NOT coalesce(failed, false) AS ok,
        _e2e_ns / 1e6 AS e2e_ms, e2e_source,
        client_queue_ns / 1e6 AS client_queue_ms,
        -- the whole difference where server.request is the server's; where the server says less
        -- than its whole time, the round trips the client timed, within the difference (the header)
        CASE WHEN _outside_ns IS NULL THEN (client_ns - server_ns) / 1e6
             WHEN rtt_ns IS NOT NULL THEN _net_ns / 1e6 END AS network_ms,
        CASE WHEN engine_scope AND rtt_ns IS NOT NULL THEN (_outside_ns - _net_ns) / 1e6 END AS frontend_ms,
        _outside_ns / 1e6 AS outside_ms,
        queue_ns / 1e6 AS queue_ms, tokenize_ns / 1e6 AS tokenize_ms,
        preprocess_ns / 1e6 AS preprocess_ms, prefill_ns / 1e6 AS prefill_ms,
        decode_ns / 1e6 AS decode_ms, detokenize_ns / 1e6 AS detokenize_ms,
        postprocess_ns / 1e6 AS postprocess_ms,
        -- greatest() skips nulls in DuckDB: without server.request, other stays null
        CASE WHEN server_ns IS NOT NULL THEN
            greatest(server_ns - (coalesce(queue_ns, 0) + coalesce(tokenize_ns, 0) + coalesce(preprocess_ns, 0)
                + coalesce(prefill_ns, 0) + coalesce(decode_ns, 0) + coalesce(detokenize_ns, 0)
                + coalesce(postprocess_ns, 0)), 0) / 1e6
             -- phases without the server's total: its time beyond them, less the measured network
             WHEN _outside_ns IS NOT NULL AND rtt_ns IS NOT NULL THEN (_outside_ns - _net_ns) / 1e6 END AS other_ms,
        server_ns / 1e6 AS server_ms,
        _ttft_ns / 1e6 AS ttft_ms, ttft_source,
        CASE WHEN _out >= 2 AND _ttft_ns IS NOT NULL THEN
            ((CASE WHEN ttft_source = 'client' THEN client_ns + coalesce(client_queue_ns, 0)
                   ELSE coalesce(server_ns, end_ns - coalesce(server_start_ns, first_server_ns)) END)
             - _ttft_ns) / 1e6 / (_out - 1) END AS tpot_ms,
        itl_mean_ms,
        _out::BIGINT AS output_tokens, info_prompt::BIGINT AS prompt_tokens,
        start_ns, end_ns
    FROM r2
)
SELECT
    * EXCLUDE (start_ns, end_ns),
    CASE WHEN tpot_ms > 0 THEN 1000 / tpot_ms END AS decode_tok_s,
    start_ns, end_ns
FROM c;

-- Each request's components as rows (ordinal of _attribution_components; ms null = not measured):
-- the one place that maps a component's column to its row.
CREATE OR REPLACE TEMP TABLE _attribution_long AS
SELECT trace, request_id, ok, e2e_ms, 0 AS ordinal, client_queue_ms AS ms FROM _attribution_base
UNION ALL SELECT trace, request_id, ok, e2e_ms, 1, network_ms FROM _attribution_base
UNION ALL SELECT trace, request_id, ok, e2e_ms, 2, frontend_ms FROM _attribution_base
UNION ALL SELECT trace, request_id, ok, e2e_ms, 3, queue_ms FROM _attribution_base
UNION ALL SELECT trace, request_id, ok, e2e_ms, 4, tokenize_ms FROM _attribution_base
UNION ALL SELECT trace, request_id, ok, e2e_ms, 5, preprocess_ms FROM _attribution_base
UNION ALL SELECT trace, request_id, ok, e2e_ms, 6, prefill_ms FROM _attribution_base
UNION ALL SELECT trace, request_id, ok, e2e_ms, 7, decode_ms FROM _attribution_base
UNION ALL SELECT trace, request_id, ok, e2e_ms, 8, detokenize_ms FROM _attribution_base
UNION ALL SELECT trace, request_id, ok, e2e_ms, 9, postprocess_ms FROM _attribution_base
UNION ALL SELECT trace, request_id, ok, e2e_ms, 10, other_ms FROM _attribution_base;


-- @table attribution_requests
-- One row per request seen in spans, tokens or requests: e2e, the eleven
-- components (null = not measured), TTFT, TPOT and token counts.
-- @column trace: Trace label.
-- @column request_id: Request id.
-- @column request_key: Integer key of the request's tokens (tokens_requests); null without tokens. Filter per-token views on it.
-- @column ok: False when the request failed (requests.status = 'error'); failed requests are left out of aggregates.
-- @column e2e_ms: End-to-end latency, milliseconds (null when no span gives one); from the intended send time when the client recorded client.queue.
-- @column e2e_source: Where e2e comes from: 'client' (client.request), 'server' (server.request) or 'extent' (first to last server-clock event).
-- @column client_queue_ms: Time waiting in the load client after the intended send time (client.queue spans), milliseconds; null when the request has none.
-- @column network_ms: Network time, milliseconds: client.request minus server.request where server.request is the server's; where the server says less than its whole time (its span is the engine's, or it reported phases but no total), a round trip (the trace's shortest TCP handshake) per request and per handshake it opened, at most the client's time beyond what the server says; null without a client.request, or in those cases without a timed handshake.
-- @column frontend_ms: Time the server spent outside its engine's span (HTTP, chat template, tokenization before the engine, detokenization and streaming after), milliseconds: client.request minus the engine's span minus network_ms; null unless server_scope is 'engine' and a handshake was timed.
-- @column outside_ms: The client's time beyond what the server says it spent, milliseconds: client.request minus the engine's span (server_scope 'engine'), or, for a server that reported phases but no total, client.request minus those phases; network plus server time, before any split; null otherwise.
-- @column queue_ms: Time in queue spans, milliseconds; null when the request has none.
-- @column tokenize_ms: Time in tokenize spans, milliseconds; null when none.
-- @column preprocess_ms: Time in preprocess spans, milliseconds; null when none.
-- @column prefill_ms: Time in prefill spans, milliseconds; null when none.
-- @column decode_ms: Time in decode spans, milliseconds; null when none.
-- @column detokenize_ms: Time in detokenize spans, milliseconds; null when none.
-- @column postprocess_ms: Time in postprocess spans, milliseconds; null when none.
-- @column other_ms: server.request minus the phases, not below 0, milliseconds; for a server that reported phases but no server.request, outside_ms less network_ms; null otherwise.
-- @column server_ms: Duration of server.request, milliseconds; null when absent.
-- @column ttft_ms: Time to first token, milliseconds (null without token index 0 or a start).
-- @column ttft_source: 'client' or 'server': the clock TTFT (and TPOT) was measured on.
-- @column tpot_ms: Time per output token after the first, milliseconds: (e2e - TTFT) / (output_tokens - 1).
-- @column itl_mean_ms: Mean inter-token latency of the request, milliseconds (client-side when every token has client_recv_ns).
-- @column output_tokens: Tokens generated (requests.output_tokens, else token rows).
-- @column prompt_tokens: Prompt length, tokens (requests.prompt_tokens; null when not recorded).
-- @column decode_tok_s: Per-request decode rate, tokens per second: 1000 / tpot_ms.
-- @column start_ns: Server clock, nanoseconds: when the request started on the server (for timelines).
-- @column end_ns: Server clock, nanoseconds: when the request ended on the server.
-- @column bottleneck: The component with the most time in this request.
CREATE OR REPLACE TEMP TABLE attribution_requests AS
SELECT b.*, n.component AS bottleneck
FROM _attribution_base AS b
LEFT JOIN (
    -- the largest measured component; ties: the earlier one (a window, not an ordered aggregate,
    -- so that --engine spark takes it as written)
    SELECT trace, request_id, ordinal FROM (
        SELECT trace, request_id, ordinal,
            row_number() OVER (PARTITION BY trace, request_id ORDER BY ms DESC, ordinal) AS rn
        FROM _attribution_long WHERE ms IS NOT NULL)
    WHERE rn = 1
) AS top USING (trace, request_id)
LEFT JOIN _attribution_components AS n ON n.ordinal = top.ordinal;

-- @table attribution_components
-- The eleven components over all successful requests: mean time where measured
-- and share of the summed e2e. The share is the component's sum over requests
-- divided by the sum of e2e (docs/trace-format.md); measured is false, and
-- share null, when no request measured the component.
-- @column ordinal: Position in the order requests pass through (client_queue first, in the load client before the request leaves it; other last).
-- @column component: Component name.
-- @column measured: True when at least one request measured this component.
-- @column requests: Requests that measured it (count).
-- @column ms: Mean per measuring request, milliseconds.
-- @column total_ms: Sum over requests, milliseconds.
-- @column share: total_ms divided by the sum of e2e_ms over requests with an e2e, 0..1 (null when not measured).
-- @column bottleneck: True for the measured component with the largest share (ties: the earlier one).
CREATE OR REPLACE TEMP TABLE attribution_components AS
WITH r AS (SELECT * FROM attribution_requests WHERE ok AND e2e_ms IS NOT NULL),
agg AS (
    SELECT n.ordinal, n.component, count(l.ms) AS requests, favg(l.ms) AS ms, fsum(l.ms) AS total_ms
    FROM _attribution_components AS n
    LEFT JOIN (SELECT * FROM _attribution_long WHERE ok AND e2e_ms IS NOT NULL) AS l USING (ordinal)
    GROUP BY n.ordinal, n.component
),
shares AS (
    SELECT *, requests > 0 AS measured,
        CASE WHEN requests > 0 THEN total_ms / nullif((SELECT fsum(e2e_ms) FROM r), 0) END AS share
    FROM agg
)
SELECT ordinal, component, measured, requests, ms, total_ms, share,
    coalesce(ordinal = (SELECT ordinal FROM shares WHERE share IS NOT NULL
                        ORDER BY share DESC, ordinal LIMIT 1), false) AS bottleneck
FROM shares
ORDER BY ordinal;
