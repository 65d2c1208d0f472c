"""Encoder and decoder layers with residual connections and LayerNorm, Post-LN or Pre-LN.

Shape legend: B batch, T target length, S source length, D model dim.
Post-LN (the paper): x = LayerNorm(x + Dropout(Sublayer(x))).
Pre-LN (modern, Xiong et al. 2020): x = x + Dropout(Sublayer(LayerNorm(x))); the stack then ends
with a final LayerNorm (the model owns it).
"""
from __future__ import annotations

import torch
from torch import nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.mlp import FeedForward

NORM_POSITIONS = ("post", "pre")


class _Residual(nn.Module):
    """One sublayer's residual connection and its LayerNorm, placed after (post) or before (pre)."""

    def __init__(self, d_model: int, dropout: float, norm_position: str):
        super().__init__()
        if norm_position not in NORM_POSITIONS:
            raise ValueError(f"norm_position must be one of {NORM_POSITIONS}, got {norm_position!r}")
        self.norm = nn.LayerNorm(d_model)
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
        norm_position: "post" or "pre". activation: "relu" or "gelu". impl: "sdpa" or "math".
        attention_dropout: dropout on the attention weights.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.1,
                 norm_position: str = "post", activation: str = "relu", impl: str = "sdpa",
                 attention_dropout: float = 0.0):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=attention_dropout, impl=impl)
        self.ffn = FeedForward(d_model, d_ff, activation)
        self.res_attn = _Residual(d_model, dropout, norm_position)
        self.res_ffn = _Residual(d_model, dropout, norm_position)

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
