"""shakespeare-char and shakespeare-char-llama: character-level language models of Tiny Shakespeare.

shakespeare-char is nanoGPT's CPU configuration (Karpathy, nanoGPT README, "baby GPT" on a
MacBook): 4 layers, 4 heads, d_model 128, block 64, batch 12, 2,000 iterations, AdamW lr 1e-3
(β2 0.99, weight decay 0.1) with 100 warm-up steps and cosine decay to 1e-4 at step 2,000, no
dropout, no biases. nanoGPT reports a validation loss of about 1.88 for it.
One change from nanoGPT: the weights start from GPT-2's init scaled to this width. GPT-2 draws every
matrix from N(0, 0.02²) at d_model 768; a matrix-vector product's variance grows with the width it
sums over, so the same init at d_model 128 is 0.02·√(768/128) ≈ 0.049. With nanoGPT's width-blind
0.02 this model ends 2,000 steps at about 1.91 (4 seeds); with 0.049 at about 1.77 (README, from
bench/lm.py). `--set init_std=0.02` restores nanoGPT's init.
Its training step runs the matrix products in bf16 autocast (train/speed.py; weights, gradients,
optimizer and loss stay fp32, attention computes in fp32 inside nn/short_attention.py's kernel,
which reads and writes the bf16 projections directly) on CPUs with native bf16 products
(AVX512-BF16 or AMX): at this size the step is small matrix products, which bf16 runs about twice as
fast (bench/train_step.py). Seed 0 ends 2,000 steps at validation loss 1.7700 (evaluated in fp32;
1.7709 before the short-attention kernel) against the fp32 step's 1.771; elsewhere, and with
`--set autocast=none`, the step is fp32.
shakespeare-char-llama is the same budget and parameter count in the LLaMA style: RoPE, RMSNorm,
SwiGLU and grouped-query attention (2 KV heads for 4 query heads), with d_ff 384 so that the
attention and FFN matrices hold exactly as many parameters as the GPT-2-style blocks.
"""
from __future__ import annotations

import math

from attnlab.models.gpt import GPTConfig
from attnlab.nn.cpu_tuning import native_bf16
from attnlab.recipes.recipe import Recipe
from attnlab.tasks.language_model import TextDataConfig
from attnlab.train.config import TrainConfig

NAME = "shakespeare-char"
LLAMA_NAME = "shakespeare-char-llama"
D_MODEL = 128
SIZES = dict(d_model=D_MODEL, n_heads=4, n_layers=4, max_seq_len=64, dropout=0.0, bias=False,
             init_std=round(0.02 * math.sqrt(768 / D_MODEL), 4))  # GPT-2's init at this width: 0.049


def train_config() -> TrainConfig:
    """nanoGPT's schedule for the baby GPT: 2,000 steps, warm-up 100, cosine to 1e-4."""
    return TrainConfig(lr_schedule="cosine", lr=1e-3, min_lr=1e-4, warmup_steps=100, lr_decay_steps=2000,
                       max_steps=2000, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1, clip_grad_norm=1.0,
                       eval_every=250, log_every=50, checkpoint_every=250)


def recipe():
    fast = dict(autocast="bf16") if native_bf16() else {}
    return Recipe(name=NAME, description="GPT-2-style character LM of Tiny Shakespeare (nanoGPT's CPU baby GPT)",
                  model=GPTConfig.from_name("gpt2", **SIZES),
                  data=TextDataConfig(dataset="tinyshakespeare", tokenizer="char", block_size=64, batch_size=12),
                  train=train_config().from_dict({**train_config().to_dict(), **fast}))


def llama_recipe():
    return Recipe(name=LLAMA_NAME, description="LLaMA-style character LM of Tiny Shakespeare, same size and budget",
                  model=GPTConfig.from_name("llama", **SIZES, n_kv_heads=2, d_ff=384),
                  data=TextDataConfig(dataset="tinyshakespeare", tokenizer="char", block_size=64, batch_size=12),
                  train=train_config())
