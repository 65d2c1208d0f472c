"""The Transformer layer, composed from modules: attention, an optional cross-attention, an FFN (or a
mixture of experts) and their norms, each sublayer with a residual connection, Post-LN or Pre-LN.

Shape legend: B batch, T query (target) length, S key length (source, or cached + new), D model dim,
H heads, K key/value heads, Dh head dim.

One layer type serves every family: the encoder and decoder of the 2017 paper, GPT/LLaMA blocks,
BERT and the ViT. Each model file builds the modules from its own config and passes them in by
keyword (the model is the one reader of its config's flags):

    Post-LN (the paper, BERT):  x = Norm(x + Dropout(Sublayer(x)))
    Pre-LN (GPT-2 on, ViT):     x = x + Dropout(Sublayer(Norm(x)));  the stack ends with a final norm

Source: Vaswani et al. 2017, §3.1 (sublayers, residuals, LayerNorm) and §5.4 (residual dropout);
Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture" (Pre-LN).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from attnlab.errors import UserError
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.mlp import FeedForward
from attnlab.nn.moe import MixtureOfExperts

NORM_POSITIONS = ("post", "pre")

# Parameter names of the layers before they were built from modules (run directories saved then
# still load): the norms lived inside per-sublayer residual wrappers.
LEGACY_NORM_NAMES = {"res_attn.norm.": "attn_norm.", "res_self.norm.": "attn_norm.",
                     "res_cross.norm.": "cross_attn_norm.", "res_ffn.norm.": "ffn_norm."}


class LayerOutput(NamedTuple):
    """What a TransformerLayer returns."""

    hidden: torch.Tensor                      # (B, T, D)
    aux_loss: torch.Tensor                    # () this layer's MoE load-balancing loss (0 for a dense FFN)
    attn_weights: torch.Tensor | None = None  # (B, H, T, S) self-attention weights, with need_weights


def _rename_legacy_keys(module, state_dict, prefix, *args) -> None:
    """load_state_dict pre-hook: map the pre-redesign parameter names onto the current ones."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        rest = key[len(prefix):]
        for old, new in LEGACY_NORM_NAMES.items():
            if rest.startswith(old):
                state_dict[prefix + new + rest[len(old):]] = state_dict.pop(key)
                break


class TransformerLayer(nn.Module):
    """Self-attention, then (optionally) cross-attention over an encoder's output, then an FFN or a
    mixture of experts; each sublayer wrapped in a residual connection with its norm.

    Args (keyword-only):
        self_attn: the (masked) self-attention, a MultiHeadAttention.
        ffn: a position-wise FFN module (B, T, D) -> (B, T, D), or a MixtureOfExperts (which also
            returns its load-balancing loss).
        attn_norm, ffn_norm: the norms of the two sublayers (LayerNorm or RMSNorm of width D).
        norm_position: "post" (the paper, BERT) or "pre" (GPT-2 on, LLaMA, ViT).
        dropout: on each sublayer's output before the residual sum (paper §5.4).
        cross_attn, cross_attn_norm: encoder–decoder attention and its norm (the paper's decoder);
            both or neither.
    Raises:
        ValueError: for an unknown norm_position, or cross_attn without cross_attn_norm.
    Source: Vaswani et al. 2017, §3.1 (encoder and decoder layers); Radford et al. 2019 and Touvron
        et al. 2023, §2.2 (the decoder-only block with Pre-norm).
    """

    def __init__(self, *, self_attn: MultiHeadAttention, ffn: nn.Module, attn_norm: nn.Module, ffn_norm: nn.Module,
                 norm_position: str, dropout: float = 0.0, cross_attn: MultiHeadAttention | None = None,
                 cross_attn_norm: nn.Module | None = None):
        super().__init__()
        if norm_position not in NORM_POSITIONS:
            raise UserError(f"norm_position must be one of {NORM_POSITIONS}, got {norm_position!r}")
        if (cross_attn is None) != (cross_attn_norm is None):
            raise UserError("cross_attn and cross_attn_norm go together: pass both or neither")
        # Registration order (sublayers, then norms) fixes the parameter order: the init's random
        # draws and the optimiser's state follow it, so it matches the layers runs were trained with.
        self.self_attn, self.cross_attn, self.ffn = self_attn, cross_attn, ffn
        self.attn_norm, self.cross_attn_norm, self.ffn_norm = attn_norm, cross_attn_norm, ffn_norm
        self.pre_norm = norm_position == "pre"
        self.dropout = nn.Dropout(dropout)
        self.register_load_state_dict_pre_hook(_rename_legacy_keys)

    def _pre(self, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """The sublayer's input: Norm(x) with Pre-LN, x itself with Post-LN."""
        return norm(x) if self.pre_norm else x

    def _post(self, x: torch.Tensor, out: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """The residual sum x + Dropout(out), normalised after with Post-LN."""
        x = x + self.dropout(out)
        return x if self.pre_norm else norm(x)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor | None = None, cache: KVCache | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None, need_weights: bool = False,
                is_causal: bool = False, memory: torch.Tensor | None = None, memory_mask: torch.Tensor | None = None,
                memory_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
                token_mask: torch.Tensor | None = None) -> LayerOutput:
        """Args:
            x: (B, T, D) the layer's input.
            mask: bool self-attention mask, broadcastable to (B, H, T, S), True = may attend (causal,
                window, padding), or None.
            cache: this layer's self-attention KV cache (incremental decoding).
            rope: (cos, sin) of the new positions for rotary embeddings, or None.
            need_weights: also return the (B, H, T, S) self-attention weights (math path).
            is_causal: mask is None and the attention is plain causal over x (no cache, no padding).
            memory: (B, S, D) encoder output for cross-attention (None when memory_kv is given).
            memory_mask: (B, 1, 1, S) bool source-padding mask for cross-attention.
            memory_kv: precomputed cross-attention (k, v), each (B, H, S, Dh).
            token_mask: (B, T) bool, True = a real token: the MoE load-balancing loss counts only
                these (padding left out); None = every token is real.
        Returns:
            LayerOutput(hidden (B, T, D), aux_loss (), attn_weights or None).
        """
        out, weights = self.self_attn(self._pre(x, self.attn_norm), mask=mask, cache=cache, rope=rope,
                                      need_weights=need_weights, is_causal=is_causal)
        x = self._post(x, out, self.attn_norm)
        if self.cross_attn is not None:
            out, _ = self.cross_attn(self._pre(x, self.cross_attn_norm), memory, mask=memory_mask, kv=memory_kv)
            x = self._post(x, out, self.cross_attn_norm)
        h = self._pre(x, self.ffn_norm)
        if isinstance(self.ffn, MixtureOfExperts):
            out, aux = self.ffn(h, token_mask)
        else:
            out, aux = self.ffn(h), x.new_zeros(())
        return LayerOutput(self._post(x, out, self.ffn_norm), aux, weights)


def encoder_layer(*, d_model: int, n_heads: int, d_ff: int, activation: str, norm_position: str, dropout: float,
                  attention_dropout: float, norm_eps: float, impl: str) -> TransformerLayer:
    """A bidirectional encoder layer with LayerNorms of ε norm_eps (BERT: Post-LN; ViT: Pre-LN)."""
    return TransformerLayer(self_attn=MultiHeadAttention(d_model, n_heads, dropout=attention_dropout, impl=impl),
                            ffn=FeedForward(d_model, d_ff, activation), attn_norm=nn.LayerNorm(d_model, eps=norm_eps),
                            ffn_norm=nn.LayerNorm(d_model, eps=norm_eps), norm_position=norm_position, dropout=dropout)
