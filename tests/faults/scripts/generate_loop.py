"""A plain Hugging Face program that generates until it is killed (no tracetool imports).

Prints its pid first, then one line per generate call. The SIGKILL tests run it
under `tracetool record` and kill it at random moments.
"""

import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

print(f"pid {os.getpid()}", flush=True)
text = "the quick brown fox jumps over the lazy dog while the keeper writes down the time " * 10
raw = Tokenizer(models.BPE())
raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
raw.decoder = decoders.ByteLevel()
raw.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "</s>"],
                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>", pad_token="<pad>", padding_side="left",
                              model_input_names=["input_ids", "attention_mask"])
torch.manual_seed(0)
torch.set_num_threads(1)
cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, intermediate_size=128, eos_token_id=1, pad_token_id=0)
model = LlamaForCausalLM(cfg).eval()
n = 0
while True:
    enc = tok(["the quick brown fox", "lazy dog"], return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=16, min_new_tokens=16, do_sample=False)
    tok.batch_decode(out, skip_special_tokens=True)
    n += 1
    print(f"generated {n}", flush=True)
