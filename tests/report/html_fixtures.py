"""Traces and checks shared by the HTML page's tests.

:func:`engine_trace` is a probe-shaped trace with the engine's scraped /metrics;
:func:`hostile_trace` has request ids and a model name that are markup; :func:`check_numbers`
reads each number the page marks with its key (``data-key``) back into a float, independently of
the page's own formatters, and compares it with the JSON document at that key;
:func:`section` and :func:`marked` find a section and its marked numbers in the page's text
(no browser).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.conftest import make_trace, spans_table

MS = 1_000_000
SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
#: Every sample trace: each directory of sample_traces/ with a meta.json (a new one is tested as it lands).
SAMPLE_NAMES = tuple(sorted(p.parent.name for p in SAMPLES.glob("*/meta.json")))
assert SAMPLE_NAMES, f"no sample trace (a directory with a meta.json) under {SAMPLES}"
#: A string from a trace that is markup, mathtext and an attribute breaker at once.
HOSTILE = "<script>alert(1)</script>$x^2$&\"'<img src=x onerror=alert(2)>"


def engine_trace(directory: Path) -> Path:
    """Six client requests over 1.2 s with tokens; vLLM scraped every 100 ms: requests waiting
    then draining, KV use peaking at 90 %, two preemptions in the window, six queue times in its
    histogram's first bucket."""
    spans, toks = [], {"request_id": [], "index": [], "emit_ns": [], "client_recv_ns": [], "kv_len": []}
    for i in range(6):
        start, end = i * 150 * MS, i * 150 * MS + 400 * MS
        spans.append((f"r{i}", "client.request", start, end, "client"))
        for k in range(8):
            t = start + 80 * MS + k * 40 * MS
            toks["request_id"].append(f"r{i}")
            toks["index"].append(k)
            toks["emit_ns"].append(t)
            toks["client_recv_ns"].append(t)
            toks["kv_len"].append(100 + k)
    ts, names, values = [], [], []
    for k in range(-1, 14):
        t = k * 100 * MS
        for name, v in (("vllm:num_requests_waiting", max(0, 4 - k // 2)), ("vllm:num_requests_running", 2),
                        ("vllm:kv_cache_usage_perc", 0.9 if k == 6 else 0.5),
                        ("vllm:num_preemptions_total", 10 + (k >= 4) + (k >= 9))):
            ts.append(t)
            names.append(name)
            values.append(float(v))
    labels = [json.dumps({"model_name": "m"})] * len(ts)
    # queue times: six requests, all in the first bucket (le 0.3 s), 1.2 ms in all
    for t, (b1, b2, total, count) in ((-100 * MS, (0, 0, 0.0, 0)), (1300 * MS, (6, 6, 0.0012, 6))):
        for le, v in (("0.3", b1), ("+Inf", b2)):
            ts.append(t)
            names.append("vllm:request_queue_time_seconds_bucket")
            values.append(float(v))
            labels.append(json.dumps({"model_name": "m", "le": le}))
        for part, v in (("sum", total), ("count", count)):
            ts.append(t)
            names.append(f"vllm:request_queue_time_seconds_{part}")
            values.append(float(v))
            labels.append(json.dumps({"model_name": "m"}))
    metrics = pa.table({"ts_ns": pa.array(ts, pa.int64()), "name": names, "labels": labels,
                        "value": pa.array(values, pa.float64()), "clock": ["client"] * len(ts)})
    tokens = pa.table({"request_id": toks["request_id"], "index": pa.array(toks["index"], pa.int32()),
                       "emit_ns": pa.array(toks["emit_ns"], pa.int64()),
                       "client_recv_ns": pa.array(toks["client_recv_ns"], pa.int64()),
                       "kv_len": pa.array(toks["kv_len"], pa.int32())})
    return make_trace(directory, {"spans": spans_table(spans), "tokens": tokens, "server_metrics": metrics})


def hostile_trace(directory: Path) -> Path:
    """Two requests whose ids are markup, client and server spans, a few tokens each."""
    rows, toks = [], {"request_id": [], "index": [], "emit_ns": []}
    for i, rid in enumerate([HOSTILE, HOSTILE + "-2"]):
        s = i * 500 * MS
        rows += [(rid, "client.request", s, s + 300 * MS, "client"), (rid, "server.request", s + 5 * MS,
                                                                        s + 295 * MS, "server"),
                 (rid, "prefill", s + 10 * MS, s + 50 * MS, "server"), (rid, "decode", s + 50 * MS, s + 290 * MS,
                                                                         "server")]
        for k in range(5):
            toks["request_id"].append(rid)
            toks["index"].append(k)
            toks["emit_ns"].append(s + 50 * MS + k * 50 * MS)
    tokens = pa.table({"request_id": toks["request_id"], "index": pa.array(toks["index"], pa.int32()),
                       "emit_ns": pa.array(toks["emit_ns"], pa.int64())})
    return make_trace(directory, {"spans": spans_table(rows), "tokens": tokens},
                      meta={"notes": [HOSTILE]})


_NUMBER = re.compile(r"^([+-]?[\d,]*\.?\d+)\s*(s|ms|µs|%)?$")


def shown_value(text: str) -> tuple[float | None, float]:
    """A number as the page shows it -> (value in the document's unit before scaling, half the
    last shown digit): ``1.23 s`` -> (1230.0, 5.0), ``161.0 ms`` -> (161.0, 0.05), ``4.2 µs`` ->
    (0.0042, 0.00005), ``–`` -> None."""
    t = text.strip()
    if t == "–":
        return None, 0.0
    m = _NUMBER.match(t)
    if not m:
        raise AssertionError(f"not a number as the page writes one: {text!r}")
    digits, unit = m.group(1).replace(",", ""), m.group(2)
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    half = 0.5 * 10 ** -decimals
    v = float(digits)
    if unit == "s":
        return v * 1000, half * 1000
    if unit == "µs":
        return v / 1000, half / 1000
    return v, half


def at(doc: Any, key: str) -> Any:
    """The value at a dotted key (``components.decode.ms``, ``claims.0.share``)."""
    for part in key.split("."):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def check_numbers(numbers: list[dict[str, Any]], doc: dict[str, Any]) -> int:
    """Every marked number equals the document's value at its key, as shown (rounded); returns
    how many were checked. Raises AssertionError naming the first that does not."""
    for x in numbers:
        want = at(doc, x["key"])
        got, half = shown_value(x["text"])
        if want is None or got is None:
            assert want is None and got is None, f"{x['key']}: page {x['text']!r}, document {want!r}"
            continue
        scaled = float(want) * x["scale"]
        assert abs(scaled - got) <= half * 1.0001 + 1e-9, f"{x['key']}: page {x['text']!r}, document {want!r}"
    return len(numbers)


def section(page: str, sid: str) -> str:
    """The HTML of the page's section ``sid`` (its figures and its numbers)."""
    m = re.search(rf'<section id="{re.escape(sid)}".*?</section>', page, re.S)
    assert m, f"no section {sid!r} on the page"
    return m.group(0)


_MARKED = re.compile(r'<span class="n"(?: data-scale="([^"]+)")? data-key="([^"]+)">(.*?)</span>')


def marked(text: str) -> list[dict[str, Any]]:
    """Every number marked with its key in ``text`` (a page or a section), as the browser tests
    read them: ``key``, ``scale`` and the ``text`` shown."""
    return [{"key": html.unescape(k), "scale": float(sc) if sc else 1.0, "text": html.unescape(t)}
            for sc, k, t in _MARKED.findall(text)]


def engine_scope_trace(directory: Path, handshake: bool) -> Path:
    """vLLM-shaped: the server's spans are its engine's (``requests.server_scope = engine``), each
    client.request 40 ms longer than them; with ``handshake`` the probe timed a 2 ms TCP connect,
    so network and the server's frontend can be split."""
    rows = []
    if handshake:
        rows.append(("", "client.connect", -10 * MS, -8 * MS, "client"))
    toks: dict[str, list[Any]] = {"request_id": [], "index": [], "emit_ns": []}
    for i in range(3):
        s = i * 2000 * MS
        rows += [(f"r{i}", "client.request", s, s + 1040 * MS, "client"),
                 (f"r{i}", "server.request", s, s + 1000 * MS, "server"),
                 (f"r{i}", "prefill", s, s + 60 * MS, "server"),
                 (f"r{i}", "decode", s + 60 * MS, s + 1000 * MS, "server")]
        for k in range(10):
            toks["request_id"].append(f"r{i}")
            toks["index"].append(k)
            toks["emit_ns"].append(s + 60 * MS + k * 100 * MS)
    requests = pa.table({"request_id": ["r0", "r1", "r2"], "status": ["ok"] * 3,
                         "output_tokens": pa.array([10] * 3, pa.int32()), "server_scope": ["engine"] * 3})
    tokens = pa.table({"request_id": toks["request_id"], "index": pa.array(toks["index"], pa.int32()),
                       "emit_ns": pa.array(toks["emit_ns"], pa.int64())})
    return make_trace(directory, {"spans": spans_table(rows), "tokens": tokens, "requests": requests})
