"""shakespeare-char-mamba: the linear-time challenger on shakespeare-char's data and budget.

The same text, character tokenizer, blocks (64 × 12) and 2,000 steps as shakespeare-char, with a
Mamba language model of about the same size: 7 Mamba layers of d_model 128 (d_state 16, d_conv 4,
expand 2, dt_rank 8: 825 k parameters against the GPT-2 style's 804 k, +2.6%). Optimisation
follows the Mamba paper's language-model recipe (Gu & Dao 2023, Appendix E.2: AdamW β (0.9, 0.95),
weight decay 0.1 except on A_log and D, gradient clipping 1.0, linear warm-up then cosine decay).
The peak learning rate, 4e-3, is the best of a sweep on the validation text (seed 0: 1e-3 → 1.5646,
2e-3 → 1.5544, 4e-3 → 1.5377, 8e-3 → 1.5453), 4× the GPT recipe's 1e-3; the paper's
improved recipe uses 5× GPT-3's rate.
On CPUs with native bf16 products (AVX512-BF16 or AMX) the step runs under bf16 autocast, as
shakespeare-char's (train/speed.py): in_proj, out_proj and the output projection multiply in bf16
(fp32 accumulation); in_proj's outputs are cast back to fp32 where the causal convolution and the
selective scan read them (nn/causal_conv.py, nn/ssm.py: both kernels compute in fp32, the state
included), and x_proj and dt_proj, whose outputs only the scan reads, stay fp32 (an fp32 island,
nn/cpu_autocast.py: in bf16 their casts cost more than their products); the norms, the residual
stream, the weights, their gradients and the optimizer stay fp32, and evaluations run in fp32.
Seed 0 ends 2,000 steps at validation loss 1.5368 against the fp32 step's 1.5377 (README; AMD EPYC,
before the fp32 island; with it, on Intel: 1.5456, against 1.5437 without); `--set autocast=none`
is the fp32 reference.
"""
from __future__ import annotations

from attnlab.models.mamba import MambaConfig
from attnlab.nn.cpu_tuning import native_bf16
from attnlab.recipes.recipe import Recipe
from attnlab.recipes.shakespeare_char import D_MODEL
from attnlab.tasks.language_model import TextDataConfig
from attnlab.train.config import TrainConfig

NAME = "shakespeare-char-mamba"


def recipe():
    fast = dict(autocast="bf16") if native_bf16() else {}
    return Recipe(name=NAME, description="Mamba (selective state-space) character LM of Tiny Shakespeare, "
                  "same size and budget as shakespeare-char",
                  model=MambaConfig(d_model=D_MODEL, n_layers=7, d_state=16, d_conv=4, expand=2, max_seq_len=64),
                  data=TextDataConfig(dataset="tinyshakespeare", tokenizer="char", block_size=64, batch_size=12),
                  train=TrainConfig(lr_schedule="cosine", lr=4e-3, min_lr=1e-4, warmup_steps=100,
                                    lr_decay_steps=2000, max_steps=2000, beta1=0.9, beta2=0.95, eps=1e-8,
                                    weight_decay=0.1, clip_grad_norm=1.0, eval_every=250, log_every=50,
                                    checkpoint_every=250, **fast))
