"""Budget files: parsed strictly, and every kind of budget passes and fails as written."""

from __future__ import annotations

from pathlib import Path

import pytest

import analyzers
from tracetool.errors import BadInput, UsageError
from tracetool.report import build_report, load_budget, parse_budget
from tracetool.report.budget import COMPONENTS


def budget_file(tmp_path: Path, text: str, name: str = "budget.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def checks(report) -> dict[str, tuple[str, float | None]]:
    return {c.key: (c.status, c.value) for c in report.gate.checks}


def test_components_are_the_analyzers_components() -> None:
    assert COMPONENTS == analyzers.COMPONENTS


def test_every_key_kind_parses(tmp_path: Path) -> None:
    b = load_budget(budget_file(tmp_path, """
p95_ttft_ms = 500
mean_itl_ms = 25.5
p99_e2e_ms = 30000
p50_itl_pct = 10
p95_tpot_pct = 0
network = 0.2
decode = 1

[report]
tolerance_pct = 7.5
confidence = 0.9
bootstrap = 500
seed = 42
min_requests = 4
default_checks = false
unmeasured = "fail"
"""))
    kinds = {lim.key: (lim.kind, lim.metric, lim.stat, lim.value) for lim in b.limits}
    assert kinds["p95_ttft_ms"] == ("absolute", "ttft", "p95", 500.0)
    assert kinds["mean_itl_ms"] == ("absolute", "itl", "mean", 25.5)
    assert kinds["p50_itl_pct"] == ("relative", "itl", "p50", 10.0)
    assert kinds["p95_tpot_pct"] == ("relative", "tpot", "p95", 0.0)
    assert kinds["network"] == ("share", "network", None, 0.2)
    s = b.settings
    assert (s.tolerance_pct, s.confidence, s.bootstrap, s.seed, s.min_requests, s.default_checks, s.unmeasured) \
        == (7.5, 0.9, 500, 42, 4, False, "fail")


@pytest.mark.parametrize(("text", "expected"), [
    ("p95_ttft = 500", "unknown key 'p95_ttft' (did you mean 'p95_ttft_ms'?)"),
    ("p96_ttft_ms = 500", "unknown key 'p96_ttft_ms'"),
    ("netwrok = 0.2", "unknown key 'netwrok' (did you mean 'network'?)"),
    ("p95_ttft_ms = -1", "p95_ttft_ms = -1: an absolute budget is a positive number of ms"),
    ("p95_ttft_ms = 0", "p95_ttft_ms = 0: an absolute budget is a positive number of ms"),
    ("p95_ttft_ms = \"500ms\"", "p95_ttft_ms = '500ms': expected a number, not str"),
    ("p95_ttft_ms = true", "p95_ttft_ms = True: expected a number, not bool"),
    ("p95_ttft_ms = nan", "p95_ttft_ms = nan: expected a finite number"),
    ("p50_itl_pct = -5", "p50_itl_pct = -5: a relative budget is the slowdown allowed"),
    ("network = 20", "network = 20: a share budget is a fraction of e2e in (0, 1]"),
    ("network = 0", "network = 0: a share budget"),
    ("[limits]\np95_ttft_ms = 1", "unknown key 'limits'"),
    ("report = 1", "report must be a table ([report]), not int"),
    ("[report]\ntolerance = 5", "unknown key 'report.tolerance' (did you mean 'report.tolerance_pct'?)"),
    ("[report]\nconfidence = 2", "report.confidence = 2: expected a confidence from 0.5 to 0.999"),
    ("[report]\nbootstrap = 10", "report.bootstrap = 10: expected an integer from 200 to 100000"),
    ("[report]\nbootstrap = 2000.0", "report.bootstrap = 2000.0: expected an integer"),
    ("[report]\ndefault_checks = 1", "report.default_checks = 1: expected true or false"),
    ("[report]\nunmeasured = \"ignore\"", "report.unmeasured = 'ignore': expected \"skip\" or \"fail\""),
    ("[report]\ntolerance_pct = -1", "report.tolerance_pct = -1: expected a slowdown in percent"),
    ("p95_ttft_ms = 500\np95_ttft_ms = 400", "not valid TOML"),
    ("p95_ttft_ms = ", "not valid TOML"),
])
def test_bad_budget_files_name_the_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    p = budget_file(tmp_path, text)
    with pytest.raises(BadInput) as e:
        load_budget(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: ") and expected in msg
    assert "\n" not in msg.strip() or "not valid TOML" in msg


@pytest.mark.parametrize(("make", "expected"), [
    (lambda d: d / "missing.toml", "budget file not found"),
    (lambda d: d, "is a directory, not a budget file"),
])
def test_unreadable_budget_files(tmp_path: Path, make, expected: str) -> None:
    with pytest.raises(BadInput, match=expected):
        load_budget(make(tmp_path))


def test_non_utf8_budget(tmp_path: Path) -> None:
    p = tmp_path / "b.toml"
    p.write_bytes(b"p95_ttft_ms = 5\xff\n")
    with pytest.raises(BadInput, match="not UTF-8"):
        load_budget(p)


def test_relative_budget_without_baseline_is_a_usage_error(runs) -> None:
    b = parse_budget({"p50_itl_pct": 10}, "b.toml")
    with pytest.raises(UsageError, match=r"b\.toml: p50_itl_pct compare with a baseline: pass --baseline"):
        build_report(runs["candidate"], None, b)


def test_absolute_budgets_pass_and_fail_as_written(runs) -> None:
    lat = runs["candidate"].side().latency  # the figures the report shows: ms to 3 decimals
    p95_ttft, p50_itl = lat["ttft"]["p95"], lat["itl"]["p50"]
    assert p95_ttft == round(runs["candidate"].doc["ttft_ms"]["p95"], 3)
    b = parse_budget({"p95_ttft_ms": p95_ttft * 1.01, "p50_itl_ms": p50_itl * 0.99,
                      "mean_e2e_ms": lat["e2e"]["mean"] + 1}, "b.toml")
    got = checks(build_report(runs["candidate"], None, b))
    assert got["p95_ttft_ms"] == ("pass", p95_ttft)
    assert got["p50_itl_ms"] == ("fail", p50_itl)
    assert got["mean_e2e_ms"][0] == "pass"
    rep = build_report(runs["candidate"], None, b)
    assert not rep.passed
    assert rep.failing_lines() == [f"FAIL p50_itl_ms: p50 ITL {p50_itl:.1f} ms exceeds the budget p50_itl_ms = "
                                   f"{p50_itl * 0.99:g}"]


def test_a_value_equal_to_the_budget_passes(runs) -> None:
    v = runs["candidate"].side().latency["ttft"]["p50"]
    got = checks(build_report(runs["candidate"], None, parse_budget({"p50_ttft_ms": v}, "b.toml")))
    assert got["p50_ttft_ms"][0] == "pass"


def test_share_budgets_pass_and_fail_as_written(runs) -> None:
    comps = runs["candidate"].side().components
    decode, network = comps["decode"]["share"], comps["network"]["share"]
    assert decode > 0.9 and network < 0.01  # a decode-dominant chat
    b = parse_budget({"decode": 0.9, "network": 0.01, "prefill": 0.5}, "b.toml")
    got = checks(build_report(runs["candidate"], None, b))
    assert got["decode"] == ("fail", decode)
    assert got["network"] == ("pass", network)
    assert got["prefill"][0] == "pass"


def test_relative_budgets_pass_and_fail_as_written(runs) -> None:
    """ITL +30 % (regressed vs baseline): a 10 % ITL budget fails, a 50 % one passes; TTFT did not
    move, so a 0 % TTFT budget does not fail (its interval straddles 0; above 0 it only warns)."""
    b = parse_budget({"p50_itl_pct": 10, "p95_itl_pct": 50, "p50_ttft_pct": 0}, "b.toml")
    rep = build_report(runs["regressed"], runs["baseline"], b)
    got = {c.key: c for c in rep.gate.checks}
    assert got["p50_itl_pct"].status == "fail" and got["p50_itl_pct"].ci_low > 10
    assert got["p95_itl_pct"].status == "pass" and got["p95_itl_pct"].ci_low < 50
    assert got["p50_ttft_pct"].status in ("pass", "warn") and got["p50_ttft_pct"].ci_low < 0
    assert got["p50_ttft_pct"].kind == "relative" and got["p50_itl_pct"].kind == "relative"
    # a relative budget replaces the default check of the same statistic; the others stay
    assert [c.key for c in rep.gate.checks].count("p50_itl_pct") == 1
    assert {"p95_ttft_pct", "p50_tpot_pct", "p95_e2e_pct"} <= set(got)
    assert got["p95_ttft_pct"].kind == "regression"


def test_default_checks_off_and_tolerance(runs) -> None:
    off = parse_budget({"report": {"default_checks": False}, "p50_itl_pct": 50}, "b.toml")
    rep = build_report(runs["regressed"], runs["baseline"], off)
    assert [c.key for c in rep.gate.checks] == ["p50_itl_pct"] and rep.passed
    loose = build_report(runs["regressed"], runs["baseline"], tolerance_pct=60)
    assert loose.passed and all(c.limit == 60 for c in loose.gate.checks)


def test_unmeasured_budgets_are_skipped_or_failed_as_configured(runs) -> None:
    """An imported vLLM run measures no server phase: a network budget is unknown, not 0 %."""
    skip = build_report(runs["imported"], None, parse_budget({"network": 0.2, "p95_ttft_ms": 1000}, "b.toml"))
    got = checks(skip)
    assert got["network"] == ("skip", None) and got["p95_ttft_ms"][0] == "pass"
    assert skip.passed
    fail = build_report(runs["imported"], None,
                        parse_budget({"network": 0.2, "report": {"unmeasured": "fail"}}, "b.toml"))
    assert checks(fail)["network"] == ("fail", None) and not fail.passed
    assert "not measured" in fail.failing_lines()[0]


def test_too_few_requests_skips_relative_checks(runs) -> None:
    rep = build_report(runs["candidate"], runs["baseline"],
                       parse_budget({"report": {"min_requests": 9}}, "b.toml"))
    assert {c.status for c in rep.gate.checks} == {"skip"}
    assert "too few requests for a significance test (8 < 9" in rep.gate.checks[0].message
