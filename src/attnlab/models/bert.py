"""BERT: a Transformer encoder with token, position and segment embeddings, and its heads.

Shape legend: B batch, S sequence length, D model dim, V vocabulary, C classes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.config import BertConfig
from attnlab.nn.blocks import EncoderLayer
from attnlab.nn.mlp import ACTIVATIONS


class Bert(nn.Module):
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
            EncoderLayer(d, cfg.n_heads, cfg.d_ff, cfg.dropout, "post", cfg.activation, cfg.attention_impl,
                         cfg.attention_dropout, cfg.norm_eps) for _ in range(cfg.n_layers))
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

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

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
            raise ValueError(f"sequence of {s} tokens exceeds max_seq_len={self.cfg.max_seq_len}")
        if attention_mask is None:
            attention_mask = input_ids != self.cfg.pad_id
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = torch.arange(s, device=input_ids.device)
        x = self.embed_tokens(input_ids) + self.embed_positions(positions) + self.embed_segments(token_type_ids)
        x = self.dropout(self.embed_norm(x))
        mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S), True = real key
        for layer in self.layers:
            x = layer(x, mask)
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
