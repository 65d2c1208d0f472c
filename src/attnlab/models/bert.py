"""BERT: a Transformer encoder with token, position and segment embeddings, and its heads.

Shape legend: B batch, S sequence length, D model dim, V vocabulary, C classes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, Optional

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.config import Config, check, check_literals
from attnlab.errors import UserError
from attnlab.models.base import Model
from attnlab.nn.blocks import encoder_layer
from attnlab.nn.mlp import ACTIVATIONS


@dataclass
class BertConfig(Config):
    """The BERT encoder (Devlin et al. 2019): Post-LN, GELU, learned positions and segment embeddings.

    Defaults are BERT-base (Table/§3: L=12, H=768, A=12, 110 M parameters).
    """

    model_type: ClassVar[str] = "bert"  # the run's kind: config.json's "model_type", the task registry key

    vocab_size: int = 30522           # WordPiece vocabulary (set from the tokenizer)
    d_model: int = 768                # hidden size H
    n_layers: int = 12                # encoder layers L
    n_heads: int = 12                 # attention heads A; d_model % n_heads == 0
    d_ff: Optional[int] = None        # FFN hidden size; None = 4 * d_model (read ffn_dim)
    max_seq_len: int = 512            # rows of the learned position table
    type_vocab_size: int = 2          # segments (sentence A / B)
    activation: Literal["gelu", "gelu_tanh", "relu"] = "gelu"  # FFN non-linearity
    norm_eps: float = 1e-12           # LayerNorm ε (BERT's)
    dropout: float = 0.1              # on embeddings and sublayer outputs
    attention_dropout: float = 0.1    # on attention weights
    attention_impl: Literal["sdpa", "math"] = "sdpa"  # fused kernel or explicit math
    n_labels: int = 2                 # classes of the sequence-classification head
    pad_id: int = 0                   # special token ids (from the tokenizer; None = unknown)
    cls_id: Optional[int] = None
    sep_id: Optional[int] = None
    mask_id: Optional[int] = None

    def __post_init__(self):
        check_literals(self)
        check(self.d_ff is None or (isinstance(self.d_ff, int) and self.d_ff > 0), "d_ff", "None or a positive integer",
              self.d_ff)
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len", "type_vocab_size",
                     "n_labels"):
            value = getattr(self, name)
            check(isinstance(value, int) and value > 0, name, "a positive integer", value)
        check(self.d_model % self.n_heads == 0, "d_model", f"divisible by n_heads={self.n_heads}", self.d_model)
        check(self.norm_eps > 0, "norm_eps", "> 0", self.norm_eps)
        check(self.n_labels >= 2, "n_labels", ">= 2 (a classifier needs two classes or more)", self.n_labels)
        for name in ("dropout", "attention_dropout"):
            check(0.0 <= getattr(self, name) < 1.0, name, "in [0, 1)", getattr(self, name))
        for name in ("pad_id", "cls_id", "sep_id", "mask_id"):
            value = getattr(self, name)
            check(value is None and name != "pad_id" or value is not None and 0 <= value < self.vocab_size, name,
                   f"in [0, vocab_size={self.vocab_size})", value)

    @property
    def ffn_dim(self) -> int:
        """The FFN's hidden size: d_ff, or 4·D when it is None."""
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class Bert(Model):
    """The BERT encoder with a pooler, a masked-language-model head and a classification head.

    embeddings = LayerNorm(token + position + segment) then dropout; L Post-LN encoder layers with
    GELU FFNs; pooler = tanh(W h_[CLS]); MLM head = LayerNorm(GELU(W h)) then the token embedding
    matrix (tied) + a bias; classifier = Linear(dropout(pooled)).

    Source: Devlin et al. 2019, "BERT", §3 and Figure 2 (input representation), §3.1 (masked LM);
        Vaswani et al. 2017 for the encoder layer.
    """

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.embed_tokens = nn.Embedding(cfg.vocab_size, d, padding_idx=cfg.pad_id)
        self.embed_positions = nn.Embedding(cfg.max_seq_len, d)
        self.embed_segments = nn.Embedding(cfg.type_vocab_size, d)
        self.embed_norm = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(
            encoder_layer(d_model=d, n_heads=cfg.n_heads, d_ff=cfg.ffn_dim, activation=cfg.activation, norm_position="post",
                          dropout=cfg.dropout, attention_dropout=cfg.attention_dropout, norm_eps=cfg.norm_eps,
                          impl=cfg.attention_impl) for _ in range(cfg.n_layers))
        self.pooler = nn.Linear(d, d)
        self.mlm_transform = nn.Linear(d, d)
        self.mlm_norm = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.mlm_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.classifier = nn.Linear(d, cfg.n_labels)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():  # BERT's: normal(0, 0.02), zero biases, unit LayerNorm
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        with torch.no_grad():
            self.embed_tokens.weight[self.cfg.pad_id].zero_()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Encode a batch.

        Args:
            input_ids: (B, S) int64 token ids ([CLS] ... [SEP], right-padded).
            attention_mask: (B, S) bool/int, 1 = real token; None = input_ids != pad_id.
            token_type_ids: (B, S) int64 segment ids; None = all 0.
        Returns:
            (B, S, D) final hidden states.
        Raises:
            ValueError: if S exceeds max_seq_len.
        """
        b, s = input_ids.shape
        if s > self.cfg.max_seq_len:
            raise UserError(f"sequence of {s} tokens exceeds max_seq_len={self.cfg.max_seq_len}")
        if attention_mask is None:
            attention_mask = input_ids != self.cfg.pad_id
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = torch.arange(s, device=input_ids.device)
        x = self.embed_tokens(input_ids) + self.embed_positions(positions) + self.embed_segments(token_type_ids)
        x = self.dropout(self.embed_norm(x))
        mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S), True = real key
        for layer in self.layers:
            x = layer(x, mask=mask).hidden
        return x

    def pooled(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, S, D) -> (B, D): tanh(W h_[CLS] + b), the pooler of §3 (next-sentence / classification)."""
        return torch.tanh(self.pooler(hidden[:, 0]))

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, S, D) -> (B, S, V): the masked-LM head, its output matrix tied to the token embeddings."""
        h = self.mlm_norm(ACTIVATIONS[self.cfg.activation](self.mlm_transform(hidden)))
        return F.linear(h, self.embed_tokens.weight, self.mlm_bias)

    def classify(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, S, D) -> (B, C) class logits from the pooled [CLS] state."""
        return self.classifier(self.dropout(self.pooled(hidden)))


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """Sentence embeddings: the mean of the real tokens' hidden states, L2-normalised.

    Args:
        hidden: (B, S, D). attention_mask: (B, S), 1 = real token.
    Returns:
        (B, D) float32.
    Source: Reimers & Gurevych 2019, "Sentence-BERT", §3 (MEAN pooling), as all-MiniLM-L6-v2 uses it.
    """
    m = attention_mask.to(hidden.dtype)[..., None]  # (B, S, 1)
    emb = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return F.normalize(emb.float(), dim=-1) if normalize else emb.float()
