"""Builds a tiny Llama model on disk, offline, in seconds.

The engine suite needs a real model that vLLM's CPU backend runs fast on two
cores, with nothing downloaded: a 2-layer Llama (hidden 256, 4 heads of 64, a
head size CPU attention supports) with seeded random weights, and a byte-level
BPE tokenizer trained on text that ships with Python. Same arguments, same
bytes: every engine and every run sees the same model.

    python tests/engine/tiny_model.py DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB_SIZE = 1024
MAX_POSITIONS = 32768
# Written last: its presence means the directory is complete.
_STAMP = "peerkv-tiny-model.json"
_VERSION = 1


def _training_text() -> list[str]:
    """Plain English-ish text from the standard library's own sources."""
    import email
    import json as json_mod
    import logging

    texts = []
    for module in (email, json_mod, logging):
        for path in sorted(Path(module.__file__).parent.glob("*.py")):
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return texts


def build(out: Path) -> Path:
    out = Path(out)
    stamp = out / _STAMP
    if stamp.is_file() and json.loads(stamp.read_text()).get("version") == _VERSION:
        return out
    out.mkdir(parents=True, exist_ok=True)

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.model_max_length = MAX_POSITIONS
    fast.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(1234)
    model = LlamaForCausalLM(config)
    # Random weights give near-uniform logits, where greedy decoding turns on
    # rounding. A sharper output layer makes the argmax margin wide, so
    # "identical greedy tokens" compares KV, not noise; about 1 prompt in 50
    # still flips when its tail is computed in other pieces, so the suite
    # compares against the same pieces (engines.rerun_from_cache).
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    stamp.write_text(json.dumps({"version": _VERSION}))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_model.py DIR")
    print(build(Path(sys.argv[1])))
