"""Encoder and decoder layers with residual connections and normalisation, Post-LN or Pre-LN.

Shape legend: B batch, T target length, S source length, D model dim.
EncoderLayer and DecoderLayer are the paper's; DecoderOnlyLayer is the GPT/LLaMA block (masked
self-attention and an FFN or mixture of experts, no cross-attention).
Post-LN (the paper): x = LayerNorm(x + Dropout(Sublayer(x))).
Pre-LN (modern, Xiong et al. 2020): x = x + Dropout(Sublayer(LayerNorm(x))); the stack then ends
with a final LayerNorm (the model owns it).
"""
from __future__ import annotations

import torch
from torch import nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.mlp import FeedForward, make_ffn
from attnlab.nn.moe import MixtureOfExperts
from attnlab.nn.norm import make_norm

NORM_POSITIONS = ("post", "pre")


class _Residual(nn.Module):
    """One sublayer's residual connection and its norm (LayerNorm or RMSNorm), placed after (post) or
    before (pre) the sublayer."""

    def __init__(self, d_model: int, dropout: float, norm_position: str, norm: str = "layernorm",
                 eps: float = 1e-5, bias: bool = True):
        super().__init__()
        if norm_position not in NORM_POSITIONS:
            raise ValueError(f"norm_position must be one of {NORM_POSITIONS}, got {norm_position!r}")
        self.norm = make_norm(norm, d_model, eps, bias)
        self.dropout = nn.Dropout(dropout)
        self.pre = norm_position == "pre"

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        if self.pre:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention then FFN, each wrapped in a residual + LayerNorm (paper §3.1, encoder).

    Args:
        d_model, n_heads, d_ff: sizes. dropout: on each sublayer's output (paper §5.4).
        norm_position: "post" or "pre". activation: "relu", "gelu" or "gelu_tanh". impl: "sdpa" or "math".
        attention_dropout: dropout on the attention weights. norm_eps: the LayerNorms' ε (BERT: 1e-12).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.1,
                 norm_position: str = "post", activation: str = "relu", impl: str = "sdpa",
                 attention_dropout: float = 0.0, norm_eps: float = 1e-5):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=attention_dropout, impl=impl)
        self.ffn = FeedForward(d_model, d_ff, activation)
        self.res_attn = _Residual(d_model, dropout, norm_position, eps=norm_eps)
        self.res_ffn = _Residual(d_model, dropout, norm_position, eps=norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Args:
            x: (B, S, D). mask: (B, 1, 1, S) bool source-padding mask, True = real token.
        Returns:
            (B, S, D).
        """
        x = self.res_attn(x, lambda h: self.self_attn(h, mask=mask)[0])
        return self.res_ffn(x, self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, then FFN (paper §3.1, decoder).

    Args: as EncoderLayer.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.1,
                 norm_position: str = "post", activation: str = "relu", impl: str = "sdpa",
                 attention_dropout: float = 0.0):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=attention_dropout, impl=impl)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout=attention_dropout, impl=impl)
        self.ffn = FeedForward(d_model, d_ff, activation)
        self.res_self = _Residual(d_model, dropout, norm_position)
        self.res_cross = _Residual(d_model, dropout, norm_position)
        self.res_ffn = _Residual(d_model, dropout, norm_position)

    def forward(self, y: torch.Tensor, memory: torch.Tensor | None, self_mask: torch.Tensor | None,
                cross_mask: torch.Tensor | None, cache: KVCache | None = None,
                cross_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Args:
            y: (B, T, D) target-side states.
            memory: (B, S, D) encoder output (may be None when cross_kv is given).
            self_mask: (B, 1, T, T_total) bool, causal ∧ target padding.
            cross_mask: (B, 1, 1, S) bool source padding.
            cache: this layer's self-attention KV cache for incremental decoding.
            cross_kv: precomputed cross-attention (k, v) of the memory, each (B, H, S, Dh).
        Returns:
            (B, T, D).
        """
        y = self.res_self(y, lambda h: self.self_attn(h, mask=self_mask, cache=cache)[0])
        y = self.res_cross(y, lambda h: self.cross_attn(h, memory, mask=cross_mask, kv=cross_kv)[0])
        return self.res_ffn(y, self.ffn)


class DecoderOnlyLayer(nn.Module):
    """Masked self-attention then an FFN (or a mixture of experts), each with a residual connection
    and a norm: the block of GPT (Radford et al. 2018/2019) and LLaMA (Touvron et al. 2023, §2.2).

    Args:
        d_model, n_heads, d_ff: sizes. n_kv_heads: K (None = n_heads).
        dropout: on each sublayer's output. attention_dropout: on the attention weights.
        norm: "layernorm" or "rmsnorm". norm_position: "pre" or "post". norm_eps: the norm's ε.
        activation: "relu", "gelu" or "swiglu". bias: biases on projections and LayerNorm.
        qkv_bias: biases on the query/key/value projections (None = bias; Qwen2 has them alone).
        impl: "sdpa" or "math". n_experts: 0 = dense FFN, else E experts with moe_top_k per token.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, n_kv_heads: int | None = None,
                 dropout: float = 0.0, attention_dropout: float = 0.0, norm: str = "layernorm",
                 norm_position: str = "pre", norm_eps: float = 1e-5, activation: str = "gelu",
                 bias: bool = True, impl: str = "sdpa", n_experts: int = 0, moe_top_k: int = 2,
                 qkv_bias: bool | None = None):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, attention_dropout, bias, impl, qkv_bias)
        if n_experts:
            self.ffn = MixtureOfExperts(d_model, d_ff, n_experts, moe_top_k, activation, bias=bias)
        else:
            self.ffn = make_ffn(d_model, d_ff, activation, bias=bias)
        self.res_attn = _Residual(d_model, dropout, norm_position, norm, norm_eps, bias)
        self.res_ffn = _Residual(d_model, dropout, norm_position, norm, norm_eps, bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cache: KVCache | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None, need_weights: bool = False,
                is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Args:
            x: (B, T, D). mask: bool, broadcastable to (B, H, T, S), True = may attend (causal,
                window and key padding), or None. cache: this layer's KV cache.
            rope: (cos, sin) of the new positions, or None (absolute positions were added to x).
            need_weights: also return the (B, H, T, S) attention weights (math path).
            is_causal: mask is None and the attention is plain causal over x (no cache, no padding).
        Returns:
            (x (B, T, D), the MoE load-balancing loss () (0 for a dense FFN), weights or None).
        """
        weights = None

        def attend(h):
            nonlocal weights
            out, weights = self.self_attn(h, mask=mask, cache=cache, rope=rope, need_weights=need_weights,
                                          is_causal=is_causal)
            return out

        aux = x.new_zeros(())

        def ffn(h):
            nonlocal aux
            if isinstance(self.ffn, MixtureOfExperts):
                h, aux = self.ffn(h)
                return h
            return self.ffn(h)

        x = self.res_attn(x, attend)
        x = self.res_ffn(x, ffn)
        return x, aux, weights
