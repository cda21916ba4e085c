"""``vllm bench serve --save-result --save-detailed`` result JSON.

The shape, as vLLM writes it (``vllm/benchmarks/serve.py``; before v0.10
``benchmarks/benchmark_serving.py``): one JSON object with run facts
(``date`` as ``%Y%m%d-%H%M%S`` local time of saving, ``backend``,
``model_id``, ``num_prompts``, ``duration`` in seconds, aggregates such as
``mean_ttft_ms``) and, with ``--save-detailed``, parallel per-request lists:

* ``ttfts``: seconds from sending the request to the first streamed chunk
  (``time.perf_counter`` differences);
* ``itls``: per request, the seconds between consecutive chunks;
* ``input_lens`` / ``output_lens``: prompt and output tokens (output 0 for
  failed requests);
* ``errors``: ``""`` for success, the error text otherwise; ``generated_texts``;
* newer versions also ``start_times`` (``time.perf_counter()`` at send, one
  clock for the whole run), ``latencies`` (seconds to the last chunk) and
  ``queue_times`` (client-side concurrency-semaphore wait).

Failed requests carry ``ttft = 0`` and ``itl = []``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracetool.errors import BadInput
from tracetool.importers.common import (
    CLIENT_ONLY_NOTE,
    EMIT_NS_NOTE,
    BadValue,
    ImportedRequest,
    ImportResult,
    Skips,
    chunk_note,
    count,
    cumulative,
    json_lines,
    number,
    read_json,
    seconds_to_ns,
    type_name,
)

WHAT = "a vLLM `bench serve --save-result --save-detailed` JSON"
REQUIRED = ("ttfts", "itls")
OPTIONAL = ("input_lens", "output_lens", "errors", "generated_texts", "start_times", "latencies",
            "queue_times")
#: Run facts copied into meta.json when present.
FACTS = ("date", "backend", "endpoint_type", "label", "model_id", "tokenizer_id", "num_prompts",
         "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed")


def parse(path: Path) -> ImportResult:
    try:
        data = read_json(path, WHAT)
    except BadInput:
        runs = _appended_runs(path)
        if runs > 1:  # `--append-result` writes one object per line, a run after another
            raise BadInput(f"{path}: holds {runs} results appended with --append-result; a trace holds one "
                           "run: split the file (one JSON object per line) and import each") from None
        raise
    if not isinstance(data, dict):
        raise BadInput(f"{path}: top level is a {type_name(data)}; {WHAT} holds one object")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        hint = (" (saved without --save-detailed?)" if "mean_ttft_ms" in data
                else f" (found keys: {', '.join(sorted(data)[:8]) or 'none'})")
        raise BadInput(f"{path}: no {' or '.join(missing)}: not {WHAT}{hint}")
    lists: dict[str, list[Any]] = {}
    for key in (*REQUIRED, *OPTIONAL):
        if key not in data or (key not in REQUIRED and data[key] is None):
            continue
        if not isinstance(data[key], list):
            raise BadInput(f'{path}: "{key}" is a {type_name(data[key])}, expected a list (one entry per request)')
        lists[key] = data[key]
    n = len(lists["ttfts"])
    lengths = {k: len(v) for k, v in lists.items()}
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{k} {v}" for k, v in lengths.items())
        raise BadInput(f"{path}: per-request lists disagree in length ({shown}); they must be parallel")
    if n == 0:
        raise BadInput(f"{path}: no requests (ttfts is empty)")

    skips = Skips()
    base_s = _first_start(lists.get("start_times"))
    requests: list[ImportedRequest] = []
    for i in range(n):
        try:
            requests.append(_request(i, lists, base_s))
        except BadValue as e:
            skips.add(f"#{i}", str(e))
    if not requests:
        raise BadInput(f"{path}: no usable request: {skips.first()}")

    timeline = "relative" if base_s is not None else "synthetic"
    notes = [f"imported from {WHAT.removeprefix('a ')} ({path.name}): {len(requests)} of {n} requests",
             CLIENT_ONLY_NOTE, EMIT_NS_NOTE]
    if timeline == "relative":
        notes.append("request start times come from start_times (time.perf_counter of the benchmark "
                     "process): gaps between requests are real, the client clock starts at the first "
                     "request (0 ns) and wall-clock time is unknown")
    else:
        notes.append("the file has no per-request start times (only ttfts/itls; vLLM added start_times "
                     "later): every request is placed at its own zero (client.request starts at 0 ns), "
                     "so the cross-request timeline is synthetic and concurrency or ordering cannot be "
                     "read from it")
    if "errors" not in lists:
        notes.append("no errors list: requests with ttft 0 and no itls are taken as failed "
                     "(that is how vLLM records a failure)")
    if "queue_times" in lists:
        notes.append("queue_times (client-side concurrency wait before sending) are not part of "
                     "client.request, as in vLLM's own e2e latency")
    notes += chunk_note(requests)
    notes += skips.notes()
    details = {k: data[k] for k in FACTS if k in data and isinstance(data[k], (str, int, float))}
    return ImportResult(tool="vllm-bench", source=path, requests=requests, notes=notes,
                        timeline=timeline, details=details, skipped=skips.total)


def _appended_runs(path: Path) -> int:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return 0
    return sum(1 for _, value, err in json_lines(text) if err is None and isinstance(value, dict)
               and "date" in value and ("ttfts" in value or "mean_ttft_ms" in value))


def _first_start(start_times: list[Any] | None) -> float | None:
    if not start_times:
        return None
    good = []
    for v in start_times:
        try:
            good.append(number(v, "start time"))
        except BadValue:
            continue
    return min(good) if good else None


def _request(i: int, lists: dict[str, list[Any]], base_s: float | None) -> ImportedRequest:
    r = ImportedRequest(request_id=f"vllm-{i}")
    if "input_lens" in lists:
        r.prompt_tokens = _opt_count(lists["input_lens"][i], "input_lens")
    if "output_lens" in lists:
        r.output_tokens = _opt_count(lists["output_lens"][i], "output_lens")
    raw_itl = lists["itls"][i]
    if not isinstance(raw_itl, list):
        raise BadValue(f"itls entry is a {type_name(raw_itl)}, not a list")
    ttft_ns = seconds_to_ns(lists["ttfts"][i], "ttft")
    gaps = [seconds_to_ns(g, "itl") for g in raw_itl]

    error = lists["errors"][i] if "errors" in lists else None
    if error is not None and not isinstance(error, str):
        raise BadValue(f"errors entry is a {type_name(error)}, not a string")
    failed = bool(error) if "errors" in lists else (ttft_ns == 0 and not gaps)
    if failed:
        r.status = "error"
        r.error = error or "no output (ttft 0, no itls)"
        r.output_tokens = r.output_tokens or 0
        return r

    start = 0
    if base_s is not None:
        start = seconds_to_ns(lists["start_times"][i], "start time") - round(base_s * 1e9)
        start = max(start, 0)
    if ttft_ns == 0 and not gaps:
        raise BadValue("successful request with ttft 0 and no itls (no streamed chunk was timed)")
    r.start_ns = start
    r.token_ns = cumulative(start + ttft_ns, gaps)
    r.end_ns = r.token_ns[-1]
    if "latencies" in lists and lists["latencies"][i] is not None:
        # vLLM's latency ends at the last chunk too; keep the later one if they disagree
        r.end_ns = max(r.end_ns, start + seconds_to_ns(lists["latencies"][i], "latency"))
    return r


def _opt_count(v: Any, what: str) -> int | None:
    return None if v is None else count(v, what)
