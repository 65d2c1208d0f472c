"""Causal self-attention of short sequences in training: one fused C++ kernel per direction.

Shape legend: B batch, H query heads, K key/value heads (K divides H), T length (≤ MAX_LENGTH), Dh
head dim (a multiple of 16, ≤ MAX_HEAD_DIM).

    o_i = Σ_{j≤i} softmax_j(scale · q_i · k_j) v_j        (scale = 1 / √Dh)

For a small model's short windows (nanoGPT's baby GPT: T = 64, Dh = 32) the fused SDPA kernel spends
its time on setup, not arithmetic, and under bf16 autocast q, k, v must be cast to fp32 for it
(its bf16 backward is ~3× slower: nn/attention.py) and back. short_attention.cpp keeps a head's rows
in L1 in fp32, reads fp32 or bf16 directly and writes the output in the inputs' dtype, in the
(B, T, H, Dh) layout the output projection reads (no copy); the backward pass recomputes the weights
from the saved log-sum-exp, as FlashAttention does. Equal to F.scaled_dot_product_attention up to fp32
summation order (tests/nn/test_short_attention.py: values and gradients, fp32 and bf16).

Used by nn/attention.py's scaled_dot_product_attention where `applies` says so: the plain causal mask
(is_causal), no dropout, key/value heads dividing the query heads (GQA), CPU fp32/bf16 inputs that autograd
records (a training step; inference keeps SDPA and the decode kernels, whose bits it would otherwise
change), the C++ extension built, not under torch.compile. bench/train_step.py times the step with it.

Source: Vaswani et al. 2017, §3.2.1 (equation 1); Dao et al. 2022, "FlashAttention", §3.1 and
Algorithm 2 (the backward pass from the saved log-sum-exp); Ainslie et al. 2023 (grouped-query).
"""
from __future__ import annotations

import math

import torch

from attnlab.errors import UserError
from attnlab.nn import quant_kernel  # the one C++ extension, built at first use

MAX_LENGTH = 128    # T up to which the kernel runs (a head's score row stays in 8 vectors)
MAX_HEAD_DIM = 128  # Dh up to which it runs (a multiple of 16)
DTYPES = (torch.float32, torch.bfloat16)


class _ShortCausalAttention(torch.autograd.Function):
    """o = attention(q, k, v) by short_attention.cpp: q (B, H, T, Dh), k, v (B, K, T, Dh), one dtype,
    last dim contiguous."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        o, lse = torch.ops.attnlab_attention.short_attention_forward(q, k, v, scale)  # o (B, T, H, Dh)
        o = o.transpose(1, 2)                                                          # (B, H, T, Dh) view
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx, g_o):
        q, k, v, o, lse = ctx.saved_tensors
        if g_o.stride(-1) != 1 or g_o.dtype != q.dtype:
            g_o = g_o.to(q.dtype).contiguous()
        gq, gk, gv = torch.ops.attnlab_attention.short_attention_backward(q, k, v, o, g_o, lse, ctx.scale)
        return gq.transpose(1, 2), gk.transpose(1, 2), gv.transpose(1, 2), None


def _last_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float) -> bool:
    """Whether `causal_attention` runs these (B, H, T, Dh) inputs of plain causal self-attention (module doc)."""
    t, dh = q.shape[-2], q.shape[-1]
    return (dropout == 0.0 and q.dim() == 4 and k.shape == v.shape and k.dim() == 4
            and (q.shape[0], q.shape[2], q.shape[3]) == (k.shape[0], k.shape[2], k.shape[3])
            and q.shape[1] % k.shape[1] == 0 and 1 <= t <= MAX_LENGTH
            and dh % 16 == 0 and dh <= MAX_HEAD_DIM and q.device.type == "cpu"
            and all(x.dtype in DTYPES for x in (q, k, v))
            and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
            and not torch.compiler.is_compiling() and quant_kernel.kernel() == "cpp")


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(Q Kᵀ / √Dh + causal mask) V by the fused kernel (module doc; check `applies` first).

    Args:
        q: (B, H, T, Dh). k, v: (B, K, T, Dh), K dividing H (grouped-query attention: query head h
            uses key/value head h // (H / K)). fp32 or bf16 (mixed: all computed as fp32),
            T ≤ MAX_LENGTH, Dh a multiple of 16 up to MAX_HEAD_DIM.
    Returns:
        (B, H, T, Dh) in the inputs' dtype (fp32 where they differ): a view of a (B, T, H, Dh) tensor.
    Raises:
        UserError: where the C++ extension is not available (nn/quant_kernel.py says why).
    """
    if quant_kernel.kernel() != "cpp":
        raise UserError("short causal attention needs the C++ extension, which is not available here")
    dtype = q.dtype if q.dtype == k.dtype == v.dtype else torch.float32
    q, k, v = (_last_contiguous(x.to(dtype)) for x in (q, k, v))
    return _ShortCausalAttention.apply(q, k, v, 1.0 / math.sqrt(q.shape[-1]))
