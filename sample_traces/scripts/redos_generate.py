"""A plain Hugging Face generate script whose tokenizer has a catastrophic regex in it.

Recorded for ``sample_traces/slow-tokenizer`` with

    tracetool record --pyspy -o slow-tokenizer -- python sample_traces/scripts/redos_generate.py

It loads tracetool's demo model (random init, nothing downloaded), then puts a
pure-Python pre-tokenizer in front of the tokenizer's own (the `tokenizers`
library's ``PreTokenizer.custom`` hook, which is how people plug Python text
handling into a fast tokenizer). That pre-tokenizer keeps hyphenated and
apostrophised words together with the "word" pattern ``^([a-z]+[-']?)+$``,
whose nested quantifier backtracks exponentially when a long word does not
match (here: a long word followed by punctuation, "internationalization,").
That is a ReDoS, the textbook pathological tokenizer of docs/domain.md §3: every
``tokenizer(...)`` call spends hundreds of milliseconds in it, inside the
tokenize span that ``tracetool record`` measures, and py-spy sees the time in
``split_words`` (a ``tokenize`` frame).

Nothing here knows about tracetool: ``tracetool record`` patches generate and
the tokenizer when transformers loads.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

#: The naive "word" pattern: the nested quantifier is the bug (a word that does not match tries
#: every way of splitting its letters into groups before giving up: 2^len steps).
WORD = re.compile(r"^([a-z]+[-']?)+$")
PIECES = re.compile(r"\s+|\S+")
PARTS = re.compile(r"\w+|[^\w\s]")

#: Prompts: ordinary text whose long words carry punctuation, as real text does.
PROMPTS = [
    "Explain why the deinstitutionalization, internationalization, and institutionalization, "
    "of the service made its latency harder to reason about.",
    "Summarise the argument about deinstitutionalization, compartmentalization, and "
    "internationalization, in plain words for a new engineer.",
    "Was it institutionalization, deinstitutionalization, or compartmentalization, that the "
    "reviewers of the design feared most?",
    "Why does compartmentalization, unlike deinstitutionalization, or internationalization, "
    "rarely survive a reorganization of a well-run team?",
]


class SlowPreTokenizer:
    """A pure-Python pre-tokenizer: splits on whitespace, keeps words that match WORD whole,
    and cuts the others into word characters and punctuation."""

    def split_words(self, _index: int, normalized: Any) -> list[Any]:
        text = str(normalized)
        pieces = []
        for m in PIECES.finditer(text):
            piece = m.group()
            if piece.isspace() or WORD.match(piece.lower()):
                pieces.append(normalized[m.start():m.end()])
            else:
                for p in PARTS.finditer(piece):
                    pieces.append(normalized[m.start() + p.start():m.start() + p.end()])
        return pieces

    def pre_tokenize(self, pretok: Any) -> None:
        pretok.split(self.split_words)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--requests", type=int, default=12, help="prompts to answer, one generate each")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    args = ap.parse_args()

    import torch
    from tokenizers import pre_tokenizers

    from collectors.demo import load_demo_model

    torch.set_num_threads(1)
    model, tok = load_demo_model(seed=0)
    raw = tok.backend_tokenizer
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.PreTokenizer.custom(SlowPreTokenizer()), raw.pre_tokenizer])

    for i in range(args.requests):
        enc = tok(PROMPTS[i % len(PROMPTS)], return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=args.max_new_tokens,
                                 min_new_tokens=args.max_new_tokens, do_sample=False)
        text = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        print(f"{i}: {len(text)} characters")


if __name__ == "__main__":
    main()
