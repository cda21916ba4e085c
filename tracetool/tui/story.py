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
    """A row of the Diagnosis panel: the name users know, the claims behind its verdict, and the
    suspects of the findings catalogue (its ``suspect`` column) whose findings it shows."""

    name: str
    short: str
    claims: tuple[str, ...]
    suspects: tuple[str, ...]


#: The usual suspects (docs/domain.md §3), in the order a request meets them. A row with claims is
#: always shown (the story's verdict); a row without one only when one of its findings fires. Which
#: finding sits on which row is the catalogue's fact (``findings_catalogue.suspect``), not this list's.
SUSPECTS = (
    Suspect("load client", "client", (), ("client_queue",)),
    Suspect("network RTT", "network", ("network",), ("network", "frontend")),
    Suspect("tokenizer", "tokenizer", ("tokenize",), ("tokenize", "detokenize")),
    Suspect("queueing", "queueing", ("queue",), ("queue",)),
    Suspect("prefill", "prefill", ("prefill",), ("prefill",)),
    Suspect("decode", "decode", ("decode",), ("decode",)),
    Suspect("pre/post-processing", "pre/post", ("preprocess", "postprocess"), ("preprocess", "postprocess")),
    Suspect("other server time", "other", (), ("other",)),
    Suspect("one replica", "replica", (), ("replica",)),
    Suspect("the evidence", "evidence", (), ("evidence",)),
)


@dataclass(frozen=True)
class DiagnosisRow:
    """What the Diagnosis panel prints for one suspect: the verdict (None on a row without a claim,
    whose badge says whether a warning fired) and every finding that fired for it, warnings first."""

    name: str
    short: str
    verdict: str | None
    badge: str
    share: float | None
    evidence: str
    findings: tuple[dict[str, Any], ...]


def row_of(suspect: str) -> Suspect | None:
    """The Diagnosis row that shows the findings of a catalogue suspect (None for one no row shows)."""
    return next((s for s in SUSPECTS if suspect in s.suspects), None)


def diagnosis(view: View) -> list[DiagnosisRow]:
    """One row per suspect: the analyzer's verdict, share and evidence, and every finding on it.

    A suspect made of two components (pre/post-processing) shows the stronger
    verdict, the summed measured share and both evidence lines.
    """
    claims = {r["key"]: r for r in view.analysis.rows("claims") if r["scope"] is None}  # about the mean request
    fired = view.analysis.rows("findings")  # warnings first, then catalogue order
    rows = []
    for s in SUSPECTS:
        found = [claims[k] for k in s.claims if k in claims]
        hits = tuple(f for f in fired if f["suspect"] in s.suspects)
        if not found and not hits:
            continue
        if not found:  # findings only: the badge says whether one asks for action
            warn = any(f["severity"] == "warning" for f in hits)
            rows.append(DiagnosisRow(s.name, s.short, None, "!" if warn else "·", None, "", hits))
            continue
        verdict = max((c["verdict"] for c in found), key=lambda v: _STRENGTH.get(v, 0))
        shares = [c["share"] for c in found if c["share"] is not None]
        share = sum(shares) if shares else None
        measured = [c for c in found if c["verdict"] != "unmeasured"]
        evidence = "; ".join(c["detail"] for c in (measured or found))
        if measured and len(measured) < len(found):
            evidence += "; " + ", ".join(c["component"] for c in found if c not in measured) + " not measured"
        rows.append(DiagnosisRow(s.name, s.short, verdict, BADGES.get(verdict, "?"), share, evidence, hits))
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
    component = CLAIMS[spec.key][0]
    row = row_of(component)
    fired = view.analysis.rows("findings")
    related = {f["id"] for f in fired if row is not None and f["suspect"] in row.suspects}
    statement = CLAIMS[spec.key][1]
    if spec.scope:  # a story about a tail: judged on that tail, with the tail findings beside it
        component = spec.tail_component or component
        statement = f"{statement} (about the {spec.scope_level} {(spec.scope_metric or '').upper()} tail)"
        related = {f["id"] for f in fired if f["id"].startswith("tail-")}
    elif spec.key == "throughput":
        related = {"throughput-conflation"}
    elif spec.key == "compute-bound":
        related = {"decode-memory-bound", "decode-compute-heavy", "no-roofline", "small-model-or-cpu"}
    findings = tuple(f for f in view.doc.get("findings", []) if f["id"] in related)
    verdict = view.claim(spec.key, spec.scope)
    if verdict is None:  # the analysis was made without this claim (never in the app; kept honest)
        return Verdict(words, spec.key, component, statement, "unmeasured", BADGES["unmeasured"], None,
                       "this analysis did not judge the claim", findings)
    return Verdict(words, spec.key, component, statement, verdict["verdict"], BADGES.get(verdict["verdict"], "?"),
                   verdict["share"], verdict["detail"], findings)


__all__ = ["BADGES", "SUSPECTS", "VERDICT_STYLE", "DiagnosisRow", "Story", "Suspect", "Verdict",
           "diagnosis", "judge", "row_of", "stories"]
