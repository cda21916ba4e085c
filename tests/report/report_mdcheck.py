"""A small structural check of GitHub-flavoured Markdown tables."""

from __future__ import annotations

import re

DELIM = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+$")


def cells(line: str) -> list[str]:
    """Cells of a table row, honouring escaped pipes."""
    assert line.startswith("|") and line.endswith("|"), line
    inner = line[1:-1]
    return [c.strip() for c in re.split(r"(?<!\\)\|", inner)]


def tables(md: str) -> list[list[list[str]]]:
    """Every table as rows of cells (header first, delimiter row dropped); asserts GFM structure:
    a header row, then a delimiter row with one ``---`` per column, then rows of the same width."""
    lines = md.splitlines()
    out: list[list[list[str]]] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("|"):
            assert i == 0 or lines[i - 1] == "", f"table must follow a blank line: {lines[i]!r}"
            header = cells(lines[i])
            assert i + 1 < len(lines) and DELIM.match(lines[i + 1]), f"no delimiter row after {lines[i]!r}"
            assert len(cells(lines[i + 1])) == len(header), lines[i + 1]
            rows = [header]
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                row = cells(lines[j])
                assert len(row) == len(header), f"row has {len(row)} cells, header {len(header)}: {lines[j]!r}"
                rows.append(row)
                j += 1
            assert j == len(lines) or lines[j] == "", f"table must end with a blank line: {lines[j]!r}"
            out.append(rows)
            i = j
        else:
            i += 1
    return out
