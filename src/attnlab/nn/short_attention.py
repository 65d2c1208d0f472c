"""Attention of short sequences in training: one fused C++ kernel per direction.

Shape legend: B batch, H query heads, K key/value heads (K divides H), T queries, S keys (both
≤ MAX_LENGTH), Dh head dim (a multiple of 16, ≤ MAX_HEAD_DIM), L_b sequence b's real keys.

    o_i = Σ_{j ∈ seen(i)} softmax_j(scale · q_i · k_j) v_j        (scale = 1 / √Dh)
    seen(i) = {j < L_b}, and with causal attention also j ≤ i

— the masks a right-padded batch makes (nn/masks.py padding_mask for an encoder or for
cross-attention, causal_mask & padding_mask for a decoder), or none. For small models' short
windows (nanoGPT's baby GPT: T = 64, Dh = 32; Multi30k's sentences: ~15 tokens, Dh = 64) the fused
SDPA kernel spends its time on setup, not arithmetic, and under bf16 autocast q, k, v must be cast
to fp32 for it (its bf16 backward is ~3× slower: nn/attention.py) and back. short_attention.cpp
keeps a head's rows in L1 in fp32, reads fp32 or bf16 directly, writes the output in the inputs'
dtype in the (B, T, H, Dh) layout the output projection reads (no copy), and skips the keys a row
cannot see; the backward pass recomputes the weights from the saved log-sum-exp, as FlashAttention
does. A query that sees no key gives zeros, as nn/attention.py. Equal to
F.scaled_dot_product_attention up to fp32 summation order (tests/nn/test_short_attention.py: values
and gradients, fp32 and bf16).

Used by nn/attention.py's scaled_dot_product_attention where `plan` finds it applies: no dropout,
key/value heads dividing the query heads (GQA), a mask of the forms above or none, CPU fp32/bf16
inputs that autograd records (a training step; inference keeps SDPA and the decode kernels, whose
bits it would otherwise change), the C++ extension loaded (either build), not under torch.compile.
bench/train_step.py times the steps with it and without (its candidates bf16_sdpa and fused_sdpa).
The kernel is written on nn/lanes.h's vectors: 16 lanes with AVX512, 8 native ones in the AVX2 build
(CPUs such as AMD EPYC Zen 3). Through SIMDe's emulated 16-lane vectors it had lost to SDPA there
(bench/results/train_step_amd_epyc_zen3.json: shakespeare-char 0.79x, multi30k-en-de 0.95x), so
SDPA ran on AVX2 until it had its own 8-lane form.

Source: Vaswani et al. 2017, §3.2.1 (equation 1); Dao et al. 2022, "FlashAttention", §3.1 and
Algorithm 2 (the backward pass from the saved log-sum-exp); Ainslie et al. 2023 (grouped-query).
"""
from __future__ import annotations

import math

import torch

from attnlab.errors import UserError
from attnlab.nn import quant_kernel  # the one C++ extension, built at first use

MAX_LENGTH = 128    # T and S up to which the kernel runs (a row of scores stays in 8 vectors)
MAX_HEAD_DIM = 128  # Dh up to which it runs (a multiple of 16)
DTYPES = (torch.float32, torch.bfloat16)


class _ShortAttention(torch.autograd.Function):
    """o = attention(q, k, v) by short_attention.cpp: q (B, H, T, Dh), k, v (B, K, S, Dh), one dtype,
    last dim contiguous; key_len (B,) int64 or None; causal."""

    @staticmethod
    def forward(ctx, q, k, v, key_len, causal, scale):
        o, lse = torch.ops.attnlab_attention.short_attention_forward(q, k, v, key_len, causal, scale)
        o = o.transpose(1, 2)  # (B, T, H, Dh) -> (B, H, T, Dh), a view
        ctx.save_for_backward(q, k, v, o, lse, key_len)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, g_o):
        q, k, v, o, lse, key_len = ctx.saved_tensors
        g_o = _last_contiguous(g_o.to(q.dtype))
        gq, gk, gv = torch.ops.attnlab_attention.short_attention_backward(q, k, v, key_len, ctx.causal, o, g_o, lse,
                                                                          ctx.scale)
        return gq.transpose(1, 2), gk.transpose(1, 2), gv.transpose(1, 2), None, None, None


def _last_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _shapes_fit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    return (q.dim() == 4 and k.dim() == 4 and k.shape == v.shape and q.shape[0] == k.shape[0]
            and q.shape[3] == k.shape[3] and q.shape[1] % k.shape[1] == 0
            and 1 <= q.shape[2] <= MAX_LENGTH and 1 <= k.shape[2] <= MAX_LENGTH
            and q.shape[3] % 16 == 0 and q.shape[3] <= MAX_HEAD_DIM)


def _key_lengths(mask: torch.Tensor, batch: int, t: int, s: int) -> tuple[torch.Tensor, bool] | None:
    """(L (B,) int64, causal) when a bool mask broadcastable to (B, 1, T, S) is a right-padding mask
    (B or 1, 1, 1, S) or a causal one and'ed with it (B or 1, 1, T, T); None for any other mask."""
    if (mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[0] not in (1, batch)
            or mask.shape[3] != s or mask.shape[2] not in (1, t)):
        return None
    keys = mask[:, 0, -1]                                                      # (B or 1, S): the last query's
    lengths = keys.sum(-1)                                                     # (B or 1,)
    prefix = torch.arange(s, device=mask.device) < lengths[:, None]            # (B or 1, S)
    causal = mask.shape[2] > 1
    if causal:
        if t != s:
            return None
        want = torch.ones(t, t, dtype=torch.bool, device=mask.device).tril()[None] & prefix[:, None, :]
        if not torch.equal(mask[:, 0], want):
            return None
    elif not torch.equal(keys, prefix):
        return None
    return lengths.expand(batch).contiguous(), causal


def plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout: float,
         is_causal: bool) -> tuple[torch.Tensor | None, bool] | None:
    """(key lengths or None, causal) with which `attention` runs these inputs of
    nn/attention.scaled_dot_product_attention (q (B, H, T, Dh), k, v (B, K, S, Dh), its mask and
    flags); None where the kernel does not apply (module doc)."""
    if not (dropout == 0.0 and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
            and q.device.type == "cpu" and all(x.dtype in DTYPES for x in (q, k, v)) and _shapes_fit(q, k, v)
            and not torch.compiler.is_compiling() and quant_kernel.built_for() is not None):
        return None
    if is_causal:
        return (None, True) if mask is None and q.shape[2] == k.shape[2] else None
    if mask is None:
        return None, False
    return _key_lengths(mask, q.shape[0], q.shape[2], k.shape[2])


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_len: torch.Tensor | None = None,
              causal: bool = True) -> torch.Tensor:
    """softmax(Q Kᵀ / √Dh + mask) V by the fused kernel, the mask being sequence b's first L_b keys
    (all with key_len None), and with causal none after the query's position (module doc; `plan`
    says where it applies).

    Args:
        q: (B, H, T, Dh). k, v: (B, K, S, Dh), K dividing H (grouped-query attention: query head h
            uses key/value head h // (H / K)); S = T when causal. fp32 or bf16 (mixed: all computed
            as fp32), T, S ≤ MAX_LENGTH, Dh a multiple of 16 up to MAX_HEAD_DIM.
        key_len: (B,) int64, the real keys of each sequence (right padding), or None.
    Returns:
        (B, H, T, Dh) in the inputs' dtype (fp32 where they differ): a view of a (B, T, H, Dh) tensor.
    Raises:
        UserError: where the C++ extension is not available (nn/quant_kernel.py says why).
    """
    if quant_kernel.kernel() != "cpp":
        raise UserError("short attention needs the C++ extension, which is not available here")
    dtype = q.dtype if q.dtype == k.dtype == v.dtype else torch.float32
    q, k, v = (_last_contiguous(x.to(dtype)) for x in (q, k, v))
    if key_len is not None:
        key_len = key_len.to(torch.int64).contiguous()
    return _ShortAttention.apply(q, k, v, key_len, causal, 1.0 / math.sqrt(q.shape[-1]))
