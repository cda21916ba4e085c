"""The demo tokenizer: a byte-level BPE trained on text shipped with tracetool, cached on disk.

Nothing is downloaded. Training takes a few tens of milliseconds; the result is
still cached (``$TRACETOOL_CACHE`` or ``~/.cache/tracetool``) so every process
and every machine with the same text and ``tokenizers`` version gets the same
ids, and a read-only home only costs a retrain.
"""

from __future__ import annotations

import hashlib
import os
from importlib import resources
from pathlib import Path
from typing import Any

from tracetool.notices import say_once

VOCAB_SIZE = 2048
MIN_FREQUENCY = 2
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")
PAD, BOS, EOS = SPECIAL_TOKENS


def corpus_text() -> str:
    """The original text the BPE is trained on (collectors/demo/corpus.txt)."""
    return resources.files("collectors.demo").joinpath("corpus.txt").read_text(encoding="utf-8")


def cache_dir() -> Path:
    """Where tracetool caches what it builds locally: ``$TRACETOOL_CACHE`` or ``~/.cache/tracetool``."""
    env = os.environ.get("TRACETOOL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tracetool"


def _cache_key(text: str) -> str:
    import tokenizers

    h = hashlib.sha256()
    for part in (text, str(VOCAB_SIZE), str(MIN_FREQUENCY), ",".join(SPECIAL_TOKENS), tokenizers.__version__):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _train(text: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=MIN_FREQUENCY,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text.splitlines(), trainer=trainer)
    return tok


def raw_tokenizer() -> Any:
    """The trained ``tokenizers.Tokenizer`` (from the cache when present)."""
    from tokenizers import Tokenizer

    text = corpus_text()
    path = cache_dir() / f"demo-bpe-{_cache_key(text)}.json"
    if path.is_file():
        try:
            return Tokenizer.from_file(str(path))
        except Exception:  # a damaged cache file is rebuilt below
            pass
    tok = _train(text)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(tok.to_str(), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        say_once("demo-tokenizer-cache", f"demo tokenizer not cached ({path.parent}: {e.strerror or e}); "
                 "it is retrained in each process")
    return tok


def load_demo_tokenizer() -> Any:
    """The demo tokenizer as a transformers fast tokenizer (left padding, ``</s>`` as EOS)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=raw_tokenizer(), bos_token=BOS, eos_token=EOS,
                                   pad_token=PAD, padding_side="left",
                                   model_input_names=["input_ids", "attention_mask"])  # no token_type_ids (4.x)
