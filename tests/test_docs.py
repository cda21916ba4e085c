"""Docs are part of the feature: the README's commands are CI's, every command is documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tracetool.cli import COMMANDS
from tracetool.meta import hf_names_markdown
from tracetool.schema import tables_markdown

REPO = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, re.S)]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    blocks = readme_commands()
    test_block = next(b for b in blocks if "pytest" in b)
    test_cmd = next(ln for ln in test_block.splitlines() if not ln.startswith("#"))
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert test_cmd in ci, ".ci/run must run the README's test command verbatim"
    for needed in ("ruff check", "mypy", "pytest", "torch==2.13.0"):
        assert needed in test_cmd


def test_trace_format_doc_tables_match_the_schema() -> None:
    doc = (REPO / "docs" / "trace-format.md").read_text()
    begin = doc.index("<!-- tables:begin")
    section = doc[doc.index("\n", begin) + 1: doc.index("<!-- tables:end -->")]
    assert section.strip() == tables_markdown().strip(), \
        "docs/trace-format.md tables differ from tracetool/schema.py: regenerate with schema.tables_markdown()"


def test_trace_format_doc_lists_the_hugging_face_names_read() -> None:
    doc = (REPO / "docs" / "trace-format.md").read_text()
    begin = doc.index("<!-- hf-names:begin")
    section = doc[doc.index("\n", begin) + 1: doc.index("<!-- hf-names:end -->")]
    assert section.strip() == hf_names_markdown().strip(), \
        "docs/trace-format.md Hugging Face names differ from tracetool/meta.py: " \
        "regenerate with meta.hf_names_markdown()"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help_and_docs(name: str, cli) -> None:
    r = cli(name, "--help")
    assert r.code == 0 and len(r.out.strip()) > 80, f"{name} --help is missing or thin"
    doc = (REPO / "docs" / "cli.md").read_text()
    assert f"## `tracetool {name}`" in doc, f"docs/cli.md has no section for {name}"
