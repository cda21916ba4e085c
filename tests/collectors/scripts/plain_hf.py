"""A plain Hugging Face script with no tracetool imports: tiny Llama, BPE tokenizer, batched generate.

Used by the `tracetool record` tests; `raise` as the first argument makes it fail after generating,
`interrupt` makes it Ctrl-C itself in the middle of generate.
"""

import os
import signal
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.generation.streamers import BaseStreamer

text = "the quick brown fox jumps over the lazy dog while the keeper writes down the time " * 10
raw = Tokenizer(models.BPE())
raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
raw.decoder = decoders.ByteLevel()
raw.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "</s>"],
                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>", pad_token="<pad>", padding_side="left",
                              model_input_names=["input_ids", "attention_mask"])
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, intermediate_size=128, eos_token_id=1, pad_token_id=0)
model = LlamaForCausalLM(cfg).eval()


class CtrlC(BaseStreamer):
    """Presses Ctrl-C (SIGINT to this process) when the third token arrives."""

    def __init__(self):
        self.puts = 0

    def put(self, value):
        self.puts += 1
        if self.puts == 4:  # the prompt, then tokens 0, 1, 2
            os.kill(os.getpid(), signal.SIGINT)

    def end(self):
        pass


mode = sys.argv[1] if len(sys.argv) > 1 else ""
enc = tok(["the quick brown fox", "lazy dog"], return_tensors="pt", padding=True)
out = model.generate(**enc, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                     streamer=CtrlC() if mode == "interrupt" else None)
print(tok.batch_decode(out, skip_special_tokens=True))
if mode == "raise":
    raise RuntimeError("boom after generate")
