"""A tiny chat model for the server's tests: a LLaMA-style GPT (random weights, spread so its tokens
vary) with a byte-level BPE trained on a few sentences, ChatML special tokens and a ChatML template,
written as a GGUF file, the format `attnlab serve` is mostly given. The output rows of the special
tokens, and of the tokens that are not printable text by themselves (single bytes of a multi-byte
character, control bytes), are zero: their logit is 0 while the others reach ±2, so greedy replies
are readable text (the chat page shows them as a user would see a model's) and run to max_tokens
(the tests of length, streaming and Stop need replies that do not end by themselves)."""
from __future__ import annotations

import torch

from attnlab.interop.gguf_write import write_gguf
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.tokenizers import ByteLevelBPE

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = ["The capital of France is Paris.", "A dog runs in the snow.", "Zwei Hunde spielen im Schnee, grün und blau.",
        "Once upon a time there was a small model that liked to talk.", "2 + 2 = 4, and 3 × 3 = 9 — ça va?"] * 20


def printable(tok, i: int) -> bool:
    """Whether token i is ordinary text on its own (not special, whole UTF-8, no control character)."""
    if i in tok.special_tokens.values():
        return False
    try:
        text = tok.token_bytes(i).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return text.isprintable()


def tiny_chat_gguf(path, max_seq_len: int = 32768):
    """Write the tiny model to `path` (.gguf); return (model, tokenizer)."""
    tok = ByteLevelBPE.train(TEXT, vocab_size=320, special_tokens=SPECIAL)
    torch.manual_seed(0)
    cfg = GPTConfig.from_name("llama", vocab_size=tok.vocab_size, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2,
                              d_ff=128, max_seq_len=max_seq_len, eos_id=tok.token_to_id("<|im_end|>"))
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.15)
        model.lm_head.weight[[i for i in range(tok.vocab_size) if not printable(tok, i)]] = 0
    write_gguf(model, tok, path, chat_template=CHATML)
    return model, tok
