"""tracetool.untrusted.shown: what outside text looks like on every output path.

Fuzzed with hypothesis over any text, with the sequences that act on terminals mixed in
(OSC 0/8/52 with BEL and ST, DCS, 7-bit CSI, C1 controls, bidi controls, NUL, lone
surrogates): nothing unsafe comes out, safe text comes out as it went in, the cut is marked
with how much was left out, and the work does not grow with the input.
"""

from __future__ import annotations

import json
import logging
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.fuzzlib import fuzz_settings
from tests.untrusted.evil import (
    BIDI,
    C1,
    CSI,
    DCS,
    NUL,
    OSC_CLIPBOARD,
    OSC_LINK,
    OSC_TITLE,
    PAYLOAD,
)
from tracetool.untrusted import clip, cut_mark, json_escaped, shown

#: What must never come out raw (written out here, not taken from the module under test).
RAW = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
SEQUENCES = [OSC_TITLE, OSC_LINK, OSC_CLIPBOARD, DCS, CSI, C1, BIDI, NUL, "\ud800", "\r\n", "\u2028", "\x7f"]

texts = st.lists(st.one_of(st.text(), st.sampled_from(SEQUENCES)), max_size=8).map("".join)


def test_each_sequence_is_shown_escaped_and_readable() -> None:
    assert shown(OSC_TITLE) == "\\x1b]0;pwned\\x07"
    assert shown(OSC_LINK) == "\\x1b]8;;https://evil.example/\\x1b\\click\\x1b]8;;\\x1b\\"
    assert shown(OSC_CLIPBOARD) == "\\x1b]52;c;cHduZWQ=\\x07"
    assert shown(DCS) == "\\x1bP+q544e\\x1b\\"
    assert shown(C1) == "\\x9b31m\\x9d0;c1title\\x9c\\x90dcs\\x9c\\x85"
    assert shown(BIDI) == "\\u202eevil\\u202c\\u2066iso\\u2069\\u200f"
    assert shown(f"a{NUL}b\tc\nd\re") == "a\\x00b\\tc\\nd\\re"
    assert shown("lone \ud800 surrogate").encode("utf-8")  # printable: it encodes


def test_plain_text_is_untouched() -> None:
    for s in ("chatcmpl-7f3a", "C:\\Users\\x", "Llama 3.1 8B · 92 % – décodé ✓ 日本語 🙂", "[bold]x[/]", ""):
        assert shown(s) == s


def test_newlines_can_be_kept_for_a_block_of_lines() -> None:
    assert shown("a\nb\x1b", newlines=True) == "a\nb\\x1b"


def test_long_text_is_cut_with_a_mark_and_the_count() -> None:
    assert shown("x" * 25, 10) == "x" * 10 + cut_mark(15) == "xxxxxxxxxx…[+15 chars]"
    assert shown("x" * 11, 10).endswith("…[+1 char]")
    assert shown("x" * 10, 10) == "x" * 10
    # an escape is never split: it is written whole or left for the mark
    assert shown("abcdefgh\x1bxyz", 10) == "abcdefgh…[+4 chars]"


def test_clip_cuts_kept_text_with_the_same_mark_and_leaves_it_exact() -> None:
    assert clip("x" * 25, 10) == "x" * 10 + cut_mark(15)
    assert clip("x" * 10, 10) == "x" * 10 and clip("", 10) == ""
    assert clip(OSC_TITLE, 100) == OSC_TITLE  # kept exact: escaping is for where it is shown
    assert clip(OSC_TITLE * 10, 12) == (OSC_TITLE * 10)[:12] + cut_mark(len(OSC_TITLE) * 10 - 12)


def test_one_line_messages_and_kept_errors_are_cut_with_a_mark() -> None:
    from tracetool.errors import one_line
    from tracetool.serving.probe_http import _error_message
    from tracetool.serving.probe_types import RequestResult

    long = "why " * 2_000
    assert one_line(ValueError(long), 300).endswith(cut_mark(len(long.strip()) - 300))
    assert _error_message(json.dumps({"error": {"message": long}}).encode()).endswith(cut_mark(len(long) - 200))
    assert _error_message(long.encode()).endswith(cut_mark(len(long.strip()) - 200))  # not JSON: the body
    r = RequestResult(0, "r", 0)
    r.fail(long)
    assert r.error is not None and r.error.endswith(cut_mark(len(long) - 500))


def test_a_notice_is_logged_escaped_as_it_is_printed(caplog: pytest.LogCaptureFixture,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from tracetool import notices

    notices.reset()
    with caplog.at_level(logging.INFO, logger="tracetool"):
        assert notices.say_once("evil", f"server said {PAYLOAD}")
    logged = [r.getMessage() for r in caplog.records if r.name == "tracetool"]
    assert len(logged) == 1 and RAW.search(logged[0]) is None and "\\x1b]0;pwned" in logged[0], logged
    assert f"tracetool: {logged[0]}" in capsys.readouterr().err  # the same text on both
    notices.reset()


def test_a_hundred_megabyte_note_costs_what_a_short_one_does() -> None:
    note = "n" * 100_000_000
    out = shown(note)
    assert len(out) < 1_100 and out.endswith(cut_mark(100_000_000 - 1_000))


@fuzz_settings(1.0)
@given(texts, st.one_of(st.none(), st.integers(0, 300)))
def test_nothing_unsafe_comes_out(text: str, limit: int | None) -> None:
    out = shown(text, limit)
    assert RAW.search(out) is None, repr(out)
    out.encode("utf-8")
    assert shown(out, None) == out, "escaping twice changes nothing"
    if limit is not None:
        body = out.split("…[+")[0] if len(out) > limit else out
        assert len(body) <= limit
    if RAW.search(text) is None and (limit is None or len(text) <= limit):
        assert out == text


@fuzz_settings(0.5)
@given(st.dictionaries(texts, st.one_of(texts, st.lists(texts, max_size=3)), max_size=4))
def test_json_escaped_is_the_same_data_and_inert(doc: dict) -> None:  # type: ignore[type-arg]
    text = json_escaped(json.dumps(doc, indent=2, ensure_ascii=False))
    assert RAW.search(text.replace("\n", "")) is None
    assert json.loads(text) == doc


def test_the_payload_of_the_output_tests_is_covered() -> None:
    assert RAW.search(shown(PAYLOAD)) is None and "pwned" in shown(PAYLOAD)


def test_a_servers_stray_line_is_kept_cut_with_a_mark() -> None:
    from tracetool.serving.sse import SSEParser

    p = SSEParser()
    line = "<html>" + "z" * 500
    assert list(p.feed(line.encode() + b"\n")) == []
    assert p.junk == line[:80] + cut_mark(len(line) - 80)
