"""A model and tokenizer that need no download, and the loader for a real local model.

    from collectors.demo import load_demo_model, load_model, model_meta, hardware_meta
    model, tok = load_demo_model(seed=0)          # small Llama, seeded random init, BPE tokenizer
    model, tok = load_model("/models/llama-3.2-1b")   # a local Hugging Face directory

Importing this package does not import torch or transformers; the functions do.
"""

from __future__ import annotations

from collectors.demo.model import (
           DEMO_NAME,
           DEMO_SHAPE,
           demo_config,
           hardware_meta,
           load_demo_model,
           load_model,
           model_meta,
)
from collectors.demo.tokenizer import cache_dir, corpus_text, load_demo_tokenizer

__all__ = ["DEMO_NAME", "DEMO_SHAPE", "cache_dir", "corpus_text", "demo_config", "hardware_meta",
           "load_demo_model", "load_demo_tokenizer", "load_model", "model_meta"]
