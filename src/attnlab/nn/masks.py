"""Attention masks. One convention in the whole codebase: bool, True = may attend.

Shape legend: B batch, T query length, S key length.
Masks broadcast against attention scores of shape (B, H, T, S), so they are built as
(B, 1, T, S), (B, 1, 1, S) or (1, 1, T, S).
"""
from __future__ import annotations

import torch

from attnlab.errors import UserError


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Key-padding mask: which keys are real tokens.

    Args:
        tokens: (B, S) int64 token ids.
        pad_id: id of the padding token.
    Returns:
        (B, 1, 1, S) bool, True where the key is not padding.
    """
    return (tokens != pad_id)[:, None, None, :]  # (B, 1, 1, S)


def causal_mask(length: int, device: torch.device | None = None, offset: int = 0, window: int | None = None,
                key_start: int = 0) -> torch.Tensor:
    """Causal mask, optionally limited to a sliding window.

    Query i sits at absolute position offset + i; key j at key_start + j. The query may attend to
    the key when the key is not in its future (key <= query) and, with a window W, when it is one of
    the W most recent positions (query − key < W).

    Args:
        length: number of queries T.
        device: where to build it.
        offset: number of positions before the first query (cached decoding).
        window: W, or None for no window.
        key_start: absolute position of the first key (a rolling KV cache drops older ones).
    Returns:
        (1, 1, T, offset + T − key_start) bool, True = may attend.
    Raises:
        ValueError: if window < 1.
    Source: Vaswani et al. 2017, §3.2.3 (masked decoder self-attention); sliding window:
        Beltagy et al. 2020, "Longformer", §3.1; Jiang et al. 2023, "Mistral 7B", §2.
    """
    if window is not None and window < 1:
        raise UserError(f"sliding_window must be >= 1 or None, got {window}")
    q = torch.arange(length, device=device)[:, None] + offset
    k = torch.arange(key_start, offset + length, device=device)[None, :]
    visible = k <= q
    if window is not None:
        visible &= (q - k) < window
    return visible[None, None]  # (1, 1, T, S)
