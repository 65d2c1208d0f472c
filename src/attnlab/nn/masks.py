"""Attention masks. One convention in the whole codebase: bool, True = may attend.

Shape legend: B batch, T query length, S key length.
Masks broadcast against attention scores of shape (B, H, T, S), so they are built as
(B, 1, T, S), (B, 1, 1, S) or (1, 1, T, S).
"""
from __future__ import annotations

import torch


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Key-padding mask: which keys are real tokens.

    Args:
        tokens: (B, S) int64 token ids.
        pad_id: id of the padding token.
    Returns:
        (B, 1, 1, S) bool, True where the key is not padding.
    """
    return (tokens != pad_id)[:, None, None, :]  # (B, 1, 1, S)


def causal_mask(length: int, device: torch.device | None = None, offset: int = 0) -> torch.Tensor:
    """Causal mask: query i may attend to key j only if j <= i + offset.

    Args:
        length: number of queries T.
        device: where to build it.
        offset: number of keys before the first query (cached decoding); keys S = offset + T.
    Returns:
        (1, 1, T, offset + T) bool, True = may attend.
    Source: Vaswani et al. 2017, "Attention Is All You Need", §3.2.3 (masked decoder self-attention).
    """
    q = torch.arange(length, device=device)[:, None] + offset
    k = torch.arange(offset + length, device=device)[None, :]
    return (k <= q)[None, None]  # (1, 1, T, S)
