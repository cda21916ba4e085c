"""A checker for Chrome trace-event JSON, used by the export tests.

It checks what the Trace Event Format requires per phase and what Perfetto's
JSON importer relies on: every event has ``ph``; ``B``/``E``/``i`` have
``pid``, ``tid``, a numeric ``ts``; ``i`` has a scope ``s``; ``C`` has numeric,
finite args; ``M`` has ``args.name``; on every (pid, tid) track ``B``/``E`` pair
up by name like a stack and timestamps never decrease in file order.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

REQUIRED = {
    "B": ("pid", "tid", "ts", "name"),
    "E": ("pid", "tid", "ts"),
    "i": ("pid", "tid", "ts", "name", "s"),
    "C": ("pid", "ts", "name", "args"),
    "M": ("pid", "name", "args"),
}


def check_trace_events(doc: Any) -> list[str]:
    """Problems found in a parsed document (empty when it is well formed)."""
    problems: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["top level must be an object with a traceEvents list"]
    if "displayTimeUnit" in doc:
        problems.append("displayTimeUnit present (Perfetto reads 'ns' as the unit of ts)")
    stacks: dict[tuple[int, int], list[str]] = defaultdict(list)
    last_ts: dict[tuple[int, int], float] = {}
    for n, ev in enumerate(doc["traceEvents"]):
        where = f"event {n}"
        if not isinstance(ev, dict) or "ph" not in ev:
            problems.append(f"{where}: not an object with ph")
            continue
        ph = ev["ph"]
        if ph not in REQUIRED:
            problems.append(f"{where}: unexpected phase {ph!r}")
            continue
        missing = [k for k in REQUIRED[ph] if k not in ev]
        if missing:
            problems.append(f"{where} ({ph}): missing {missing}")
            continue
        for k in ("pid", "tid"):
            if k in ev and (not isinstance(ev[k], int) or isinstance(ev[k], bool) or ev[k] < 0):
                problems.append(f"{where}: {k} must be a non-negative integer")
        if "ts" in ev:
            ts = ev["ts"]
            if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts) or ts < 0:
                problems.append(f"{where}: ts must be a finite number >= 0, got {ts!r}")
                continue
        if ph == "M":
            if not isinstance(ev["args"], dict) or not isinstance(ev["args"].get("name"), str):
                problems.append(f"{where}: metadata without args.name")
            if ev["name"] == "thread_name" and "tid" not in ev:
                problems.append(f"{where}: thread_name without tid")
            continue
        if ph == "C":
            args = ev["args"]
            if not isinstance(args, dict) or not args:
                problems.append(f"{where}: counter without args")
            elif any(not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)
                     for v in args.values()):
                problems.append(f"{where}: counter value not a finite number: {args}")
            continue
        if ph == "i" and ev["s"] not in ("t", "p", "g"):
            problems.append(f"{where}: instant scope {ev['s']!r}")
        track = (ev["pid"], ev["tid"])
        if track in last_ts and ev["ts"] < last_ts[track]:
            problems.append(f"{where}: ts {ev['ts']} goes back on track {track} (was {last_ts[track]})")
        last_ts[track] = ev["ts"]
        if ph == "B":
            stacks[track].append(ev["name"])
        elif ph == "E":
            if not stacks[track]:
                problems.append(f"{where}: E without an open B on track {track}")
            else:
                opened = stacks[track].pop()
                if ev.get("name", opened) != opened:
                    problems.append(f"{where}: E {ev.get('name')!r} closes B {opened!r} on track {track}")
    for track, open_ in stacks.items():
        if open_:
            problems.append(f"track {track}: {len(open_)} B without E ({open_})")
    return problems
