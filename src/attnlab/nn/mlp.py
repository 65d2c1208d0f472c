"""Position-wise feed-forward network.

Shape legend: B batch, T length, D model dim, F hidden dim (d_ff).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class FeedForward(nn.Module):
    """FFN(x) = W2 act(W1 x + b1) + b2, applied to each position separately.

    Args:
        d_model: D. d_ff: F (the paper uses 4·D). activation: "relu" (paper) or "gelu".
        dropout: dropout on the hidden activations.
    Source: Vaswani et al. 2017, §3.3, equation (2).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.up_proj = nn.Linear(d_model, d_ff)
        self.down_proj = nn.Linear(d_ff, d_model)
        self.act = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D)."""
        return self.down_proj(self.dropout(self.act(self.up_proj(x))))
