"""The encoder–decoder Transformer of "Attention Is All You Need" (Vaswani et al. 2017).

Shape legend: B batch, S source length, T target length, D model dim, V vocabulary, H heads, Dh head dim.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal, Optional

import torch
from torch import nn

from attnlab.config import Config, check, check_literals
from attnlab.errors import UserError
from attnlab.models.base import Model
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.blocks import TransformerLayer
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.linear import Linear
from attnlab.nn.masks import causal_mask, padding_mask
from attnlab.nn.mlp import FeedForward
from attnlab.nn.positional import SinusoidalPositionalEncoding


@dataclass
class Seq2SeqConfig(Config):
    """The encoder–decoder Transformer of Vaswani et al. 2017 (Table 3 "base": 512/8/6/2048)."""

    model_type: ClassVar[str] = "seq2seq"  # the run's kind: config.json's "model_type", the task registry key

    vocab_size: int = 8000            # joint source/target vocabulary (set from the tokenizer)
    d_model: int = 512                # model width D
    n_heads: int = 8                  # attention heads H; d_model % n_heads == 0
    n_encoder_layers: int = 6         # N encoder layers
    n_decoder_layers: int = 6         # N decoder layers
    d_ff: Optional[int] = None        # FFN hidden size; None = 4 * d_model (read ffn_dim)
    dropout: float = 0.1              # P_drop on sublayer outputs and embedding sums (paper §5.4)
    attention_dropout: float = 0.0    # dropout on attention weights (not in the paper)
    norm_position: Literal["post", "pre"] = "post"  # Post-LN (paper) or Pre-LN (modern)
    activation: Literal["relu", "gelu"] = "relu"    # FFN non-linearity (paper: ReLU)
    max_seq_len: int = 256            # longest source or target sequence, in tokens
    tie_embeddings: bool = True       # share source, target embeddings and output projection (§3.4)
    attention_impl: Literal["sdpa", "math"] = "sdpa"  # fused kernel or explicit math
    pad_id: int = 0                   # special token ids (from the tokenizer)
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self):
        check_literals(self)
        check(self.d_ff is None or (isinstance(self.d_ff, int) and self.d_ff > 0), "d_ff", "None or a positive integer",
              self.d_ff)
        for name in ("vocab_size", "d_model", "n_heads", "n_encoder_layers", "n_decoder_layers",
                     "max_seq_len"):
            check(isinstance(getattr(self, name), int) and getattr(self, name) > 0, name,
                   "a positive integer", getattr(self, name))
        check(self.d_model % self.n_heads == 0, "d_model", f"divisible by n_heads={self.n_heads}",
               self.d_model)
        check(self.d_model % 2 == 0, "d_model", "even (sinusoidal positions)", self.d_model)
        for name in ("dropout", "attention_dropout"):
            check(0.0 <= getattr(self, name) < 1.0, name, "in [0, 1)", getattr(self, name))
        for name in ("pad_id", "bos_id", "eos_id"):
            check(0 <= getattr(self, name) < self.vocab_size, name, f"in [0, vocab_size={self.vocab_size})",
                   getattr(self, name))
        check(len({self.pad_id, self.bos_id, self.eos_id}) == 3, "bos_id", "different from pad_id and eos_id",
               self.bos_id)

    @property
    def ffn_dim(self) -> int:
        """The FFN's hidden size: d_ff, or 4·D when it is None."""
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def _layer(cfg: Seq2SeqConfig, cross: bool) -> TransformerLayer:
    """An encoder layer (self-attention, FFN) or, with `cross`, a decoder layer (masked self-attention,
    encoder–decoder attention, FFN): the paper's §3.1, with cfg's norm position and dropout."""
    def attention() -> MultiHeadAttention:
        return MultiHeadAttention(cfg.d_model, cfg.n_heads, dropout=cfg.attention_dropout, impl=cfg.attention_impl)

    return TransformerLayer(self_attn=attention(), cross_attn=attention() if cross else None,
                            ffn=FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation),
                            attn_norm=nn.LayerNorm(cfg.d_model),
                            cross_attn_norm=nn.LayerNorm(cfg.d_model) if cross else None,
                            ffn_norm=nn.LayerNorm(cfg.d_model), norm_position=cfg.norm_position, dropout=cfg.dropout)


@dataclass
class DecodeState:
    """What incremental decoding keeps between steps: the source mask, each decoder layer's
    cross-attention keys/values (computed once per source) and self-attention KV cache."""

    src_mask: torch.Tensor                            # (B, 1, 1, S) bool
    cross_kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, each (B, H, S, Dh)
    caches: list[KVCache]                             # per layer

    @property
    def length(self) -> int:
        """Target tokens decoded so far (the position of the next one)."""
        return self.caches[0].length

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` (B',) int64 (beam search: the surviving hypotheses)."""
        self.src_mask = self.src_mask.index_select(0, index)
        self.cross_kv = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.cross_kv]
        for cache in self.caches:
            cache.reorder(index)


class Seq2SeqTransformer(Model):
    """Encoder–decoder Transformer with separate encode() and decode().

    Token embeddings are scaled by √D (§3.4) and summed with sinusoidal positions (§3.5), then dropout;
    N encoder layers (self-attention + FFN) and N decoder layers (masked self-attention +
    cross-attention + FFN), Post-LN or Pre-LN (§3.1); a linear output projection, tied to the
    embeddings when cfg.tie_embeddings (§3.4), gives the logits of the softmax.
    """

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.src_embed = nn.Embedding(cfg.vocab_size, d)
        self.tgt_embed = self.src_embed if cfg.tie_embeddings else nn.Embedding(cfg.vocab_size, d)
        self.positions = SinusoidalPositionalEncoding(d, cfg.max_seq_len)
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(_layer(cfg, cross=False) for _ in range(cfg.n_encoder_layers))
        self.decoder_layers = nn.ModuleList(_layer(cfg, cross=True) for _ in range(cfg.n_decoder_layers))
        pre = cfg.norm_position == "pre"
        self.encoder_norm = nn.LayerNorm(d) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d) if pre else nn.Identity()
        self.lm_head = Linear(d, cfg.vocab_size, bias=False)
        self._init_weights()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tgt_embed.weight

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        for emb in {self.src_embed, self.tgt_embed}:
            nn.init.normal_(emb.weight, std=self.cfg.d_model ** -0.5)  # ×√D in forward gives unit scale

    def _embed(self, emb: nn.Embedding, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        x = emb(tokens) * math.sqrt(self.cfg.d_model)  # (B, T, D)
        return self.dropout(self.positions(x, offset))

    def _check_length(self, tokens: torch.Tensor, what: str) -> None:
        if tokens.size(1) > self.cfg.max_seq_len:
            raise UserError(f"{what} of {tokens.size(1)} tokens exceeds max_seq_len={self.cfg.max_seq_len}")

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the encoder.

        Args:
            src: (B, S) int64 source ids, right-padded with pad_id.
        Returns:
            (memory (B, S, D), src_mask (B, 1, 1, S) bool, True = real token).
        Raises:
            ValueError: if S > max_seq_len.
        """
        self._check_length(src, "source")
        src_mask = padding_mask(src, self.cfg.pad_id)  # (B, 1, 1, S)
        x = self._embed(self.src_embed, src)
        for layer in self.encoder_layers:
            x = layer(x, mask=src_mask).hidden
        return self.encoder_norm(x), src_mask

    def start_decoding(self, memory: torch.Tensor, src_mask: torch.Tensor, max_len: int) -> DecodeState:
        """Prepare incremental decoding of up to max_len target tokens: cross-attention keys/values
        of the memory (B, S, D) are projected once here, and a KV cache is allocated per layer."""
        b = memory.size(0)
        cross_kv = [layer.cross_attn.project_kv(memory) for layer in self.decoder_layers]
        caches = [KVCache(b, self.cfg.n_heads, max_len, self.cfg.head_dim, memory.dtype, memory.device)
                  for _ in self.decoder_layers]
        return DecodeState(src_mask, cross_kv, caches)

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor | None, src_mask: torch.Tensor,
               state: DecodeState | None = None) -> torch.Tensor:
        """Run the decoder on target inputs (teacher forcing: <bos> + target).

        Args:
            tgt_in: (B, T) int64 target input ids, right-padded; with `state`, only the new tokens.
            memory: (B, S, D) encoder output (unused when `state` holds its projections).
            src_mask: (B, 1, 1, S) bool from encode().
            state: incremental-decoding state from start_decoding(); updated in place.
        Returns:
            (B, T, D) decoder output states; output_logits() turns them into logits.
        Raises:
            ValueError: if the target exceeds max_seq_len.
        """
        offset = 0 if state is None else state.length
        if offset + tgt_in.size(1) > self.cfg.max_seq_len:
            raise UserError(f"target of {offset + tgt_in.size(1)} tokens exceeds max_seq_len={self.cfg.max_seq_len}")
        self_mask = causal_mask(tgt_in.size(1), tgt_in.device, offset)  # (1, 1, T, offset + T)
        if state is None:
            self_mask = self_mask & padding_mask(tgt_in, self.cfg.pad_id)  # (B, 1, T, T)
        else:
            src_mask = state.src_mask
        y = self._embed(self.tgt_embed, tgt_in, offset)
        for i, layer in enumerate(self.decoder_layers):
            cache, kv = (None, None) if state is None else (state.caches[i], state.cross_kv[i])
            y = layer(y, mask=self_mask, cache=cache, memory=memory, memory_mask=src_mask, memory_kv=kv).hidden
        return self.decoder_norm(y)

    def output_logits(self, h: torch.Tensor) -> torch.Tensor:
        """(..., D) decoder states -> (..., V) logits (pre-softmax)."""
        return self.lm_head(h)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits.

        Args:
            src: (B, S) int64 source ids. tgt_in: (B, T) int64 decoder inputs (<bos> + target).
        Returns:
            (B, T, V) float logits; position t predicts target token t (labels = target + <eos>).
        """
        memory, src_mask = self.encode(src)
        return self.output_logits(self.decode(tgt_in, memory, src_mask))
