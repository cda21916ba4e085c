"""Hugging Face ``generate`` and tokenizers, traced per request and per token.

    rec = Recorder("trace").start()
    instrument_hf(model, tokenizer, rec)          # or: traced_generate(model, rec, **inputs)
    enc = tokenizer(prompts, return_tensors="pt", padding=True)   # -> a `tokenize` span
    out = model.generate(**enc, max_new_tokens=64)                 # -> prefill, decode, tokens
    texts = tokenizer.batch_decode(out)                            # -> a `detokenize` span
    rec.close()

Each batch row is its own request. Per request: ``tokenize`` (the tokenizer
call that built the batch, claimed by the next ``generate`` on the thread),
``prefill`` (first forward call → first token exists), ``decode`` (first →
last token), ``detokenize`` (a later decode of that row), ``server.request``
(first to last of those) and a ``requests`` row. Per generated token a
``tokens`` row: emit time from a ``BaseStreamer`` (the library's text
streamers are word-grained and batch-1 only), ``kv_len = prompt_len + index``
(``prompt_len`` without padding), and the producing step's times and id from
:mod:`collectors.torch_hooks`. Rows stop at their first EOS; the pad tokens a
finished row keeps receiving are not tokens. Token rows are written when
``generate`` returns (or raises), off the per-token path.

:func:`autopatch` patches the classes instead (``GenerationMixin.generate``
and ``PreTrainedTokenizerBase``), at import time: what ``tracetool record``
installs in an unmodified script.
"""

from __future__ import annotations

from typing import Any

from collectors.hf.autopatch import autopatch, unpatch
from collectors.hf.generate import (
    token_times_streamer,
    traced_generate,
    unwrap_generate,
    wrap_generate,
)
from collectors.hf.tokenizer import unwrap_tokenizer, wrap_tokenizer
from collectors.torch_hooks import instrument
from tracetool.recorder import Recorder


def instrument_hf(model: Any, tokenizer: Any, recorder: Recorder) -> Any:
    """Hooks on ``model``, a traced ``model.generate`` and a traced ``tokenizer``; returns the hook handle."""
    h = instrument(model, recorder)
    wrap_generate(model, recorder)
    if tokenizer is not None:
        wrap_tokenizer(tokenizer, recorder)
    return h


__all__ = ["autopatch", "instrument_hf", "token_times_streamer", "traced_generate", "unpatch",
           "unwrap_generate", "unwrap_tokenizer", "wrap_generate", "wrap_tokenizer"]
