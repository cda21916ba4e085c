-- Module network: what a trace can say about the network, and on what basis.
--
-- Network time per request is measured only where a request has both a
-- client.request and a server.request span (attribution.sql). A client-side
-- trace (tracetool probe against a server that reports no total time) still
-- holds evidence: each new connection's TCP handshake (client.connect span) is
-- one round trip to whoever accepts the connection. A streamed request on an
-- open connection costs about one round trip on the wire (the request out, the
-- last byte back) plus transfer; a new connection adds one for TCP and one or
-- two for TLS; TCP slow start adds a few for a body of some kilobytes. So
--     1 RTT  <=  network per request  <=  network_bound_round_trips x RTT
-- on the evidence, the upper bound resting on small bodies (token streams) and
-- on the handshake reaching the same host the bytes go to: a proxy or load
-- balancer that accepts the connection and then waits shows a short handshake
-- and a long network time, which only server timing can reveal. The RTT is the
-- median handshake (the minimum would understate a busy path).
--
-- A server that says less than its whole time leaves server time between the two clocks: one
-- whose spans are its engine's (requests.server_scope 'engine', e.g. vLLM's llm_request) its
-- frontend (HTTP handling, chat template, tokenization, detokenization and streaming), one that
-- reports phases but no total (llama.cpp's timings) whatever it did outside them (waiting for a
-- slot among it). The attribution takes network as the round trips the handshakes measured and
-- the rest as frontend or other (basis 'rtt-split'); without a handshake it cannot split them
-- (basis 'unsplit'), and says so instead of calling it all network.

-- @table network_evidence
-- One row: the basis of every network verdict and the client-only bound.
-- @column basis: 'measured' (some successful request has client.request and a server.request that is the server's), 'rtt-split' (the server says less than its whole time, its span being the engine's or its phases given without a total: network from the timed handshakes, the rest of the client's time beyond what the server says is frontend or other), 'unsplit' (the same without a timed handshake: not split), 'tcp-connect' (no server time at all, but client.request and client.connect spans bound it), or 'none'.
-- @column measured_requests: Successful requests whose network time is measured (count).
-- @column outside_requests: Successful requests with a client.request whose server says less than its whole time: its span is the engine's (server_scope 'engine') or it reported phases but no server.request (count).
-- @column outside_ms: Mean client time beyond what the server says it spent, over outside_requests: network plus server time, milliseconds (null without such requests).
-- @column outside_share: outside_ms / e2e_mean_ms, 0..1: the most network can hold where it is not split.
-- @column frontend_ms: Mean frontend time (outside the engine's span, beyond the measured round trips) over the requests whose span is the engine's, milliseconds; null when not split or none is.
-- @column client_requests: Successful requests with a client.request span (count).
-- @column server_requests: Successful requests with a server.request span (count).
-- @column connections: client.connect spans: TCP handshakes timed by the client (count).
-- @column rtt_ms: Median TCP handshake, milliseconds: one round trip (null without client.connect spans).
-- @column rtt_min_ms: Shortest TCP handshake, milliseconds.
-- @column tls_ms: Median TLS handshake (client.tls), milliseconds; null without TLS.
-- @column e2e_mean_ms: Mean e2e over successful requests, milliseconds.
-- @column rtt_share: rtt_ms / e2e_mean_ms, 0..1: the least share network can hold.
-- @column round_trips: Round trips the upper bound allows (threshold network_bound_round_trips, count).
-- @column bound_ms: round_trips x rtt_ms, milliseconds: the most network time per request on this evidence.
-- @column bound_share: bound_ms / e2e_mean_ms, 0..1.
-- @column verdict: With basis 'unsplit': 'misdiagnosis' when even all of outside_share is below misdiagnosis_share, else null. With basis 'tcp-connect': 'misdiagnosis' (bound_share below misdiagnosis_share), 'supported' (rtt_share at least supported_share), 'contributing' (rtt_share at least misdiagnosis_share and bound_share below supported_share), else null (the bounds straddle a threshold).
CREATE OR REPLACE TEMP TABLE network_evidence AS
WITH r AS (
    SELECT
        count(*) FILTER (WHERE network_ms IS NOT NULL) AS measured_requests,
        count(outside_ms) AS outside_requests,
        avg(outside_ms) AS outside_ms,
        avg(frontend_ms) AS frontend_ms,
        count(*) FILTER (WHERE e2e_source = 'client') AS client_requests,
        count(server_ms) AS server_requests,
        avg(e2e_ms) AS e2e_mean_ms
    FROM attribution_requests WHERE ok
),
c AS (
    SELECT
        count(*) FILTER (WHERE name = 'client.connect') AS connections,
        median((end_ns - start_ns) / 1e6) FILTER (WHERE name = 'client.connect') AS rtt_ms,
        min((end_ns - start_ns) / 1e6) FILTER (WHERE name = 'client.connect') AS rtt_min_ms,
        median((end_ns - start_ns) / 1e6) FILTER (WHERE name = 'client.tls') AS tls_ms
    FROM spans WHERE name IN ('client.connect', 'client.tls')
),
b AS (
    SELECT r.*, c.*,
        CASE WHEN r.outside_requests > 0 AND r.measured_requests > 0 THEN 'rtt-split'
             WHEN r.outside_requests > 0 THEN 'unsplit'
             WHEN r.measured_requests > 0 THEN 'measured'
             WHEN r.client_requests > 0 AND c.connections > 0 THEN 'tcp-connect'
             ELSE 'none' END AS basis,
        c.rtt_ms / nullif(r.e2e_mean_ms, 0) AS rtt_share,
        r.outside_ms / nullif(r.e2e_mean_ms, 0) AS outside_share,
        t.network_bound_round_trips AS round_trips,
        t.network_bound_round_trips * c.rtt_ms AS bound_ms,
        t.network_bound_round_trips * c.rtt_ms / nullif(r.e2e_mean_ms, 0) AS bound_share,
        t.misdiagnosis_share AS _mis, t.supported_share AS _sup
    FROM r, c, _thresholds AS t
)
SELECT basis, measured_requests, outside_requests, outside_ms, outside_share, frontend_ms,
    client_requests, server_requests, connections, rtt_ms, rtt_min_ms, tls_ms,
    e2e_mean_ms, rtt_share, round_trips, bound_ms, bound_share,
    CASE WHEN basis = 'unsplit' AND outside_share < _mis THEN 'misdiagnosis'
         WHEN basis <> 'tcp-connect' OR rtt_share IS NULL THEN NULL
         WHEN bound_share < _mis THEN 'misdiagnosis'
         WHEN rtt_share >= _sup THEN 'supported'
         WHEN rtt_share >= _mis AND bound_share < _sup THEN 'contributing'
    END AS verdict
FROM b;
