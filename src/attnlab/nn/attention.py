"""Multi-head attention: self-attention, masked self-attention and cross-attention.

Shape legend: B batch, T query length, S key length, D model dim, H query heads,
K key/value heads (K divides H; K = H is multi-head attention, K = 1 multi-query), Dh head dim.
Masks are bool, True = may attend (see masks.py).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.errors import UserError
from attnlab.nn import short_attention
from attnlab.nn.cpu_autocast import fp32_under_cpu_autocast
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.linear import Linear
from attnlab.nn.masks import causal_mask
from attnlab.nn.rope import apply_rope

IMPLS = ("sdpa", "math")


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: torch.Tensor | None = None, dropout: float = 0.0,
                                 impl: str = "sdpa", need_weights: bool = False, is_causal: bool = False
                                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(Q Kᵀ / √Dh) V, with a query that can see no key giving zeros (never NaN).

    Args:
        q: (B, H, T, Dh). k, v: (B, K, S, Dh), K dividing H (grouped-query attention: query head h
            uses key/value head h // (H / K)).
        mask: bool, broadcastable to (B, H, T, S), True = may attend; None = all visible.
        dropout: dropout on the attention weights (training only; the caller passes 0 in eval).
        impl: "sdpa" (torch's fused kernel, the FlashAttention path; in training on short windows with
            no mask, a causal one or right padding and an AVX512 build of the extension,
            nn/short_attention.py's kernel, equal up to fp32 rounding) or "math" (explicit, readable).
        need_weights: return the (B, H, T, S) attention weights; forces the math path.
        is_causal: the mask is the plain causal mask of T == S positions (pass mask=None): SDPA then
            skips the future without building any T × T tensor (O(T) extra memory).
    Returns:
        (output (B, H, T, Dh), weights (B, H, T, S) or None).
    Source: Vaswani et al. 2017, §3.2.1, equation (1).
    """
    if is_causal and mask is not None:
        raise UserError("pass either a mask or is_causal=True, not both")
    short = short_attention.plan(q, k, v, mask, dropout, is_causal) if impl == "sdpa" and not need_weights else None
    if short is not None:  # training on short windows (nn/short_attention.py)
        return short_attention.attention(q, k, v, *short), None
    if is_causal:
        if impl != "sdpa" or need_weights:
            mask = causal_mask(q.size(2), q.device)  # (1, 1, T, T) for the explicit path
    visible = None
    if mask is not None:
        visible = mask.any(dim=-1, keepdim=True)  # (B?, 1?, T, 1): does the query see any key?
        if not torch.compiler.is_compiling() and bool(visible.all()):
            visible = None  # every query sees a key (a causal mask always does): no fix-up, no copy
        else:
            mask = mask | ~visible  # let empty rows attend everywhere, then zero them below
    groups = q.size(1) // k.size(1)
    if impl == "sdpa" and not need_weights:
        with fp32_under_cpu_autocast(q) as cast:
            out = F.scaled_dot_product_attention(cast(q), cast(k), cast(v), attn_mask=mask, dropout_p=dropout,
                                                 enable_gqa=groups > 1, is_causal=is_causal)
        weights = None
    else:
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # (B, H, S, Dh)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)
        if visible is not None:
            weights = weights * visible
        out = F.dropout(weights, dropout, training=dropout > 0) @ v  # (B, H, T, Dh)
    if visible is not None:
        out = out * visible
    return out, weights


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_H) W_O, head_i = Attention(Q W_Qi, K W_Ki, V W_Vi).

    Used three ways in the encoder–decoder: encoder self-attention, masked decoder self-attention and
    encoder–decoder (cross) attention with queries from the decoder and keys/values from the encoder
    output. Grouped-query attention shares each key/value head among n_heads / n_kv_heads query heads:
    query head h uses KV head h // (n_heads / n_kv_heads).

    Args:
        d_model: D. n_heads: H. n_kv_heads: K (None = H).
        dropout: dropout on the attention weights. bias: biases on the projections.
        qkv_bias: biases on the query/key/value projections only (Qwen2); None = `bias`.
        impl: "sdpa" or "math".
    Raises:
        ValueError: if D is not divisible by H, H not divisible by K, or impl is unknown.
    Source: Vaswani et al. 2017, §3.2.2; GQA: Ainslie et al. 2023.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, dropout: float = 0.0,
                 bias: bool = True, impl: str = "sdpa", qkv_bias: bool | None = None):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model % n_heads:
            raise UserError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if n_heads % n_kv_heads:
            raise UserError(f"n_heads ({n_heads}) must be divisible by n_kv_heads ({n_kv_heads})")
        if impl not in IMPLS:
            raise UserError(f"attention impl must be one of {IMPLS}, got {impl!r}")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.dropout, self.impl = dropout, impl
        qkv_bias = bias if qkv_bias is None else qkv_bias
        self.q_proj = Linear(d_model, n_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = Linear(d_model, n_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = Linear(d_model, n_kv_heads * self.head_dim, bias=qkv_bias)
        self.out_proj = Linear(n_heads * self.head_dim, d_model, bias=bias)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, heads, self.head_dim).transpose(1, 2)  # (B, heads, T, Dh)

    def _fuses_qkv(self, x: torch.Tensor) -> bool:
        """Self-attention in training through plain Linear projections (not LoRA or quantized
        ones): there the three products run as one (`_project_qkv`). Inference keeps three, whose
        few-row products nn/linear.py computes in its own faster form."""
        return (torch.is_grad_enabled() and x.dim() == 3
                and all(type(p) is Linear for p in (self.q_proj, self.k_proj, self.v_proj)))

    def _project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, T, Dh), k, v (B, K, T, Dh) of a (B, T, D) input by one product with the three
        weights stacked (the parameters stay three, under their names): one larger product instead of
        three small ones, and under autocast one cast of x instead of three, in the forward and the
        backward pass. Equal to the three products up to fp32 summation order."""
        q_w, k_w, v_w = self.q_proj.weight, self.k_proj.weight, self.v_proj.weight
        bias = None
        if self.q_proj.bias is not None:
            bias = torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
        qkv = F.linear(x, torch.cat([q_w, k_w, v_w]), bias)  # (B, T, (H + 2K)·Dh)
        q, k, v = qkv.split([q_w.shape[0], k_w.shape[0], v_w.shape[0]], dim=-1)
        return self._split(q, self.n_heads), self._split(k, self.n_kv_heads), self._split(v, self.n_kv_heads)

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of a (B, S, D) input: each (B, K, S, Dh). Cross-attention computes these
        once per source and reuses them at every decoding step."""
        return self._split(self.k_proj(x), self.n_kv_heads), self._split(self.v_proj(x), self.n_kv_heads)

    def forward(self, x: torch.Tensor, kv_input: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                cache: KVCache | None = None, kv: tuple[torch.Tensor, torch.Tensor] | None = None,
                need_weights: bool = False, rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Args:
            x: (B, T, D) queries' input.
            kv_input: (B, S, D) keys/values' input (cross-attention); None = self-attention on x.
            mask: bool, broadcastable to (B, H, T, S), True = may attend.
            cache: self-attention KV cache; the new keys/values are appended and all are attended.
            kv: precomputed (k, v), each (B, K, S, Dh), e.g. from project_kv for cross-attention.
            need_weights: also return the attention weights (math path).
            rope: (cos, sin) of the new tokens' positions, each (B or 1, 1, T, Dh): rotary position
                embedding applied to the queries and the new keys before they are cached.
            is_causal: plain causal self-attention over x alone (mask None, nothing cached before).
        Returns:
            (output (B, T, D), weights (B, H, T, S) or None).
        """
        if kv is None and kv_input is None and self._fuses_qkv(x):
            q, k, v = self._project_qkv(x)
        else:
            q = self._split(self.q_proj(x), self.n_heads)  # (B, H, T, Dh)
            if kv is None:  # self-attention (kv_input None) or cross-attention
                kv = self.project_kv(x if kv_input is None else kv_input)
            k, v = kv  # (B, K, S, Dh) each
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, K, S_cached + T, Dh)
        dropout = self.dropout if self.training else 0.0
        out, weights = scaled_dot_product_attention(q, k, v, mask, dropout, self.impl, need_weights, is_causal)
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)  # (B, T, H·Dh)
        return self.out_proj(out), weights
