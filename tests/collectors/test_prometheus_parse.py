"""collectors.prometheus.Exposition: prometheus_client's parsers, family by family, with the
families that did not change since the previous scrape re-used; always what a fresh parse gives."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from collectors.prometheus import Exposition, NotMetrics, metrics_url, parse_metrics


def _registry() -> tuple[CollectorRegistry, Gauge, Histogram, Counter]:
    reg = CollectorRegistry()
    g = Gauge("vllm:num_requests_waiting", "w", ["model_name"], registry=reg)
    h = Histogram("vllm:request_queue_time_seconds", "q", ["model_name"], buckets=(0.1, 1.0), registry=reg)
    c = Counter("vllm:num_preemptions", "p", ["model_name"], registry=reg)
    return reg, g, h, c


def test_cached_families_give_what_a_fresh_parse_gives() -> None:
    reg, g, h, c = _registry()
    g.labels("m").set(2)
    h.labels("m").observe(0.5)
    c.labels("m").inc()
    exp = Exposition()
    first = generate_latest(reg).decode()
    assert exp.parse(first) == parse_metrics(first)
    g.labels("m").set(5)  # one family changes, the others are the same bytes
    second = generate_latest(reg).decode()
    samples, bad = exp.parse(second)
    assert bad == 0 and samples == parse_metrics(second)[0]
    values = {(n, json.loads(lab).get("le")): v for n, lab, v in samples}
    assert values[("vllm:num_requests_waiting", None)] == 5
    assert values[("vllm:request_queue_time_seconds_bucket", "1.0")] == 1
    assert values[("vllm:num_preemptions_total", None)] == 1
    assert not any(n.endswith("_created") for n, _, _ in samples)  # creation times are not state


def test_a_malformed_line_costs_only_itself() -> None:
    reg, g, _h, _c = _registry()
    g.labels("m").set(3)
    text = generate_latest(reg).decode().replace("# HELP vllm:num_preemptions",
                                                 'vllm:broken{x="1" 2 3\n# HELP vllm:num_preemptions')
    samples, bad = Exposition().parse(text)
    assert bad == 1
    assert ("vllm:num_requests_waiting", '{"model_name":"m"}', 3.0) in samples


def test_openmetrics_and_what_is_not_metrics() -> None:
    reg, g, _h, _c = _registry()
    g.labels("m").set(1)
    samples, bad = Exposition().parse(generate_openmetrics(reg).decode(), "application/openmetrics-text; version=1.0.0")
    assert bad == 0 and any(v == 1 and "num_requests_waiting" in n for n, _, v in samples)
    with pytest.raises(NotMetrics):
        Exposition().parse('{"data": [1, 2, 3]}\n')
    assert Exposition().parse("") == ([], 0)


def test_metrics_url_auto_is_the_endpoints_origin() -> None:
    assert metrics_url("auto", "https://host:8443/v1/chat/completions") == "https://host:8443/metrics"
    assert metrics_url("auto", "127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("10.0.0.5:9400/metrics") == "http://10.0.0.5:9400/metrics"
