"""Counting tokens on the client side: ``--tokenizer DIR``, or an approximation that says so.

The server's own count (``usage.prompt_tokens``) always wins; the client counts
where a server gives none, and to build prompts of a given length (``--input-len``).
A tokenizer is read from a local directory or ``tokenizer.json`` (Hugging Face
``tokenizers`` format), never downloaded. Without one, lengths are approximate
and every report and trace that uses them says ``approximate``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracetool.errors import BadInput, one_line

#: Characters per token of English text in BPE tokenizers: the approximation without --tokenizer.
CHARS_PER_TOKEN = 4.0
APPROXIMATE = "approximate (no --tokenizer: one common word or 4 characters per token)"


class Tokenizer:
    """A local Hugging Face tokenizer (``tokenizer.json``): exact counts, and text of exact lengths."""

    def __init__(self, path: Path) -> None:
        p = Path(path)
        file = p / "tokenizer.json" if p.is_dir() else p
        import tokenizers

        if not file.is_file():
            raise BadInput(f"{path}: no tokenizer.json (pass a local Hugging Face model directory)")
        try:
            self._tok: Any = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:  # the library raises its own Exception subclass for a malformed file
            raise BadInput(f"{file}: not a tokenizer.json ({one_line(e, 200)})") from e
        self.label = f"tokenizer {p}"
        self.exact = True

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids))

    def count(self, text: str) -> int:
        return len(self.encode(text))


def approx_count(text: str) -> int:
    """Approximate tokens of ``text``: 4 characters per token, at least 1 for non-empty text."""
    return max(1 if text else 0, round(len(text) / CHARS_PER_TOKEN))


def load_tokenizer(path: Path | None) -> Tokenizer | None:
    return None if path is None else Tokenizer(path)
