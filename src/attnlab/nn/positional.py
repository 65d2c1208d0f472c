"""Absolute positional encodings.

Shape legend: B batch, T length, D model dim.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from attnlab.errors import UserError


def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """The fixed sinusoidal table PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...).

    Returns:
        (max_len, D) float32.
    Raises:
        ValueError: if d_model is odd.
    Source: Vaswani et al. 2017, §3.5.
    """
    if d_model % 2:
        raise UserError(f"d_model must be even for sinusoidal positions, got {d_model}")
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]  # (T, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(pos * inv_freq)  # even dimensions: sine
    table[:, 1::2] = torch.cos(pos * inv_freq)  # odd dimensions: cosine
    return table


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal encoding of each position to its embedding (paper §3.5)."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_len, d_model), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Args:
            x: (B, T, D) embeddings.
            offset: position of the first token (cached decoding).
        Returns:
            (B, T, D), x + PE[offset : offset + T].
        Raises:
            ValueError: if offset + T exceeds the table's max_len.
        """
        end = offset + x.size(1)
        if end > self.table.size(0):
            raise UserError(f"sequence of {end} positions exceeds max_seq_len={self.table.size(0)}")
        return x + self.table[offset:end].to(x.dtype)
