"""The usual suspects and the stories people tell, laid out for the screen.

Nothing is judged here: verdicts, shares and evidence are the analyzer's
(``claims`` and ``findings`` tables, docs/findings.md). This module only
decides which of them sit on which row of the Diagnosis panel, and resolves
the words a user picks in the hypothesis dialog to a claim key with the
analyzer's own :func:`analyzers.parse_claim`.

No textual here (tested headless).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tracetool.tui.model import View

#: verdict -> badge shown beside it.
BADGES = {"supported": "✓", "contributing": "~", "misdiagnosis": "✗", "unmeasured": "?"}
#: verdict -> the theme colour variable its badge is drawn in.
VERDICT_STYLE = {"supported": "$text-success", "contributing": "$text-warning",
                 "misdiagnosis": "$text-error", "unmeasured": "$text-muted"}
_STRENGTH = {"supported": 3, "contributing": 2, "misdiagnosis": 1, "unmeasured": 0}


@dataclass(frozen=True)
class Suspect:
    """A row of the Diagnosis panel: the name users know, the claims and findings behind it."""

    name: str
    short: str
    claims: tuple[str, ...]
    findings: tuple[str, ...]


#: The usual suspects (docs/domain.md §3), in the order a request meets them.
SUSPECTS = (
    Suspect("network RTT", "network", ("network",),
            ("network-dominant", "network-slow-link", "server-frontend", "short-outputs", "network-not-bottleneck",
             "network-frontend-unsplit", "network-unmeasured")),
    Suspect("tokenizer", "tokenizer", ("tokenize",), ("tokenizer-pathological", "cpu-tokenize-hot", "tokenizer-negligible")),
    Suspect("queueing", "queueing", ("queue",), ("queue-dominant",)),
    Suspect("prefill", "prefill", ("prefill",), ("prefill-dominant", "prefill-stalls")),
    Suspect("decode", "decode", ("decode",),
            ("decode-dominant", "low-bandwidth-efficiency", "host-overhead", "decode-compute-heavy",
             "small-model-or-cpu", "kv-growth", "throughput-conflation", "decode-memory-bound")),
    Suspect("pre/post-processing", "pre/post", ("preprocess", "postprocess"), ("pipeline-dominant",)),
)


@dataclass(frozen=True)
class DiagnosisRow:
    """What the Diagnosis panel prints for one suspect."""

    name: str
    short: str
    verdict: str
    badge: str
    share: float | None
    evidence: str
    finding: dict[str, Any] | None


def diagnosis(view: View) -> list[DiagnosisRow]:
    """One row per suspect: the analyzer's verdict, share and evidence, and its most telling finding.

    A suspect made of two components (pre/post-processing) shows the stronger
    verdict, the summed measured share and both evidence lines.
    """
    claims = {r["key"]: r for r in view.analysis.rows("claims") if r["scope"] is None}  # about the mean request
    fired = {f["id"]: f for f in view.doc.get("findings", [])}
    rows = []
    for s in SUSPECTS:
        found = [claims[k] for k in s.claims if k in claims]
        if not found:
            continue
        verdict = max((c["verdict"] for c in found), key=lambda v: _STRENGTH.get(v, 0))
        shares = [c["share"] for c in found if c["share"] is not None]
        share = sum(shares) if shares else None
        measured = [c for c in found if c["verdict"] != "unmeasured"]
        evidence = "; ".join(c["detail"] for c in (measured or found))
        if measured and len(measured) < len(found):
            evidence += "; " + ", ".join(c["component"] for c in found if c not in measured) + " not measured"
        hits = [fired[f] for f in s.findings if f in fired]
        hits.sort(key=lambda f: f["severity"] != "warning")  # warnings first, catalogue order kept
        rows.append(DiagnosisRow(s.name, s.short, verdict, BADGES.get(verdict, "?"), share, evidence,
                                 hits[0] if hits else None))
    return rows


@dataclass(frozen=True)
class Story:
    """A story offered in the hypothesis dialog: the words shown and the claim key it tests."""

    key: str
    words: str


def stories() -> list[Story]:
    """The analyzer's claim catalogue, the popular misdiagnoses first (docs/domain.md §3)."""
    from analyzers import CLAIMS

    first = ("network", "tokenize", "compute-bound", "throughput", "queue", "prefill", "decode")
    keys = [k for k in first if k in CLAIMS] + [k for k in CLAIMS if k not in first]
    return [Story(k, CLAIMS[k][1]) for k in keys]


@dataclass(frozen=True)
class Verdict:
    """The analyzer's verdict on a story, with what to show beside it."""

    words: str
    key: str
    component: str
    statement: str
    verdict: str
    badge: str
    share: float | None
    detail: str
    findings: tuple[dict[str, Any], ...]


def judge(view: View, words: str) -> Verdict:
    """The verdict on ``words`` (a story from :func:`stories`, a claim key, or a phrase).

    Raises:
        UsageError: the words match no claim the analyzer knows (the message lists them).
    """
    from analyzers import CLAIMS, parse_claim

    spec = parse_claim(words)
    row = view.claim(spec.key, spec.scope)
    component = CLAIMS[spec.key][0]
    related = {f for s in SUSPECTS if component in s.claims for f in s.findings}
    statement = CLAIMS[spec.key][1]
    if spec.scope:  # a story about a tail: judged on that tail, with the tail findings beside it
        component = spec.tail_component or component
        statement = f"{statement} (about the {spec.scope_level} {(spec.scope_metric or '').upper()} tail)"
        related = {f["id"] for f in view.doc.get("findings", []) if f["id"].startswith("tail-")}
    elif spec.key == "throughput":
        related = {"throughput-conflation"}
    elif spec.key == "compute-bound":
        related = {"decode-memory-bound", "decode-compute-heavy", "no-roofline", "small-model-or-cpu"}
    findings = tuple(f for f in view.doc.get("findings", []) if f["id"] in related)
    if row is None:  # the analysis was made without this claim (never in the app; kept honest)
        return Verdict(words, spec.key, component, statement, "unmeasured", BADGES["unmeasured"], None,
                       "this analysis did not judge the claim", findings)
    return Verdict(words, spec.key, component, statement, row["verdict"], BADGES.get(row["verdict"], "?"),
                   row["share"], row["detail"], findings)


__all__ = ["BADGES", "SUSPECTS", "VERDICT_STYLE", "DiagnosisRow", "Story", "Suspect", "Verdict",
           "diagnosis", "judge", "stories"]
