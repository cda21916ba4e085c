"""What a user's script does with a local model, run under ``tracetool record``.

    python smollm2_generate.py MODEL_DIR OUT_JSON

Plain transformers, nothing of tracetool: a left-padded batch of three chats
(one answer stops on EOS early, one runs to max_new_tokens), decoded row by row
from ``out.tolist()`` (pads after a row's EOS included), then one chat alone.
What generate returned goes to OUT_JSON for the test to compare the trace with.
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

CHATS = [["What is the capital of France?", "Write a sentence about the sea.", "Say hi."],
         ["Name three primary colors."]]
MAX_NEW = 24


def main() -> None:
    path, out_json = sys.argv[1], sys.argv[2]
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    runs = []
    for chats in CHATS:
        texts = [tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True,
                                         tokenize=False) for c in chats]
        enc = tok(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=MAX_NEW, do_sample=False)
        n = enc["input_ids"].shape[1]
        rows = out.tolist()
        answers = [tok.decode(row[n:], skip_special_tokens=True) for row in rows]
        runs.append({"prompt_lens": enc["attention_mask"].sum(-1).tolist(), "generated": [r[n:] for r in rows],
                     "answers": answers})
    meta = {"eos": model.generation_config.eos_token_id, "pad": model.generation_config.pad_token_id,
            "max_new": MAX_NEW, "runs": runs}
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump(meta, f)


if __name__ == "__main__":
    main()
