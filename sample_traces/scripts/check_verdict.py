"""Check that a freshly recorded sample shows what it is meant to show (regenerate.sh runs this).

    python sample_traces/scripts/check_verdict.py NAME ANALYSIS.json

ANALYSIS.json is ``tracetool analyze --json`` of the recording. Prints one line
with the deciding numbers (so the margins can be watched across regenerations)
and exits 1 when the verdict is not the intended one, so a recording made on
an overloaded machine never silently replaces a good sample.
"""

from __future__ import annotations

import json
import sys
from typing import Any

#: name -> (bottleneck or None for any, {claim: allowed verdicts}, findings that must fire)
EXPECTED: dict[str, tuple[str | None, dict[str, set[str]], set[str]]] = {
    "chat": ("decode", {"network-rtt": {"misdiagnosis"}}, {"decode-dominant", "network-not-bottleneck"}),
    "network": ("network", {"network-rtt": {"supported"}},
                {"network-dominant", "network-slow-link", "short-outputs"}),
    "long-prompt": ("prefill", {"long-prompt": {"supported"}, "network-rtt": {"misdiagnosis"}},
                    {"prefill-dominant"}),
    "slow-tokenizer": (None, {"tokenizer": {"supported", "contributing"}},
                       {"tokenizer-pathological", "cpu-tokenize-hot"}),
    "queueing": (None, {"queueing": {"supported"}}, {"queue-dominant"}),
}


def summary(doc: dict[str, Any]) -> str:
    comps = doc["components"]
    shares = sorted(((c["share"], k) for k, c in comps.items() if c["share"] is not None), reverse=True)
    top = ", ".join(f"{k} {s * 100:.1f} %" for s, k in shares[:3])
    claims = ", ".join(f"{c['claim']}: {c['verdict']} ({(c['share'] or 0) * 100:.1f} %)" for c in doc["claims"])
    cpu = ""
    if doc.get("cpu"):
        tok = [r for r in doc["cpu"] if r.get("category") == "tokenize"]
        if tok and tok[0].get("busy_share") is not None:
            cpu = f"; CPU busy in tokenize {tok[0]['busy_share'] * 100:.1f} %"
    return f"bottleneck {doc['bottleneck']}; {top}; {claims}{cpu}"


def check(name: str, doc: dict[str, Any]) -> list[str]:
    bottleneck, claims, findings = EXPECTED[name]
    bad = []
    if bottleneck is not None and doc["bottleneck"] != bottleneck:
        bad.append(f"bottleneck is {doc['bottleneck']}, not {bottleneck}")
    verdicts = {c["claim"]: c["verdict"] for c in doc["claims"]}
    for claim, allowed in claims.items():
        if verdicts.get(claim) not in allowed:
            bad.append(f"claim {claim} is {verdicts.get(claim)}, not {'/'.join(sorted(allowed))}")
    fired = {f["id"] for f in doc["findings"]}
    bad += [f"finding {f} did not fire" for f in sorted(findings - fired)]
    if doc["failed_requests"]:
        bad.append(f"{doc['failed_requests']} requests failed")
    return bad


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in EXPECTED:
        print(f"usage: check_verdict.py {{{','.join(EXPECTED)}}} ANALYSIS.json", file=sys.stderr)
        return 2
    name, path = argv
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    print(f"regenerate: {name}: {summary(doc)}", file=sys.stderr)
    bad = check(name, doc)
    for line in bad:
        print(f"regenerate: {name}: NOT the intended verdict: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
