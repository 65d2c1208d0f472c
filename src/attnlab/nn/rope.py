"""Rotary position embedding (RoPE).

Shape legend: B batch, H heads, T length, Dh head dim (even).
Each pair of dimensions (i, i + Dh/2) of a query or key at position m is rotated by the angle
m · θ^(-2i/Dh). The dot product of a rotated query at m and a rotated key at n then depends only
on m − n (Su et al. 2021, "RoFormer", §3.2, equations (13)–(16)). Pairs are (i, i + Dh/2), the
"rotate half" layout of GPT-NeoX and Hugging Face LLaMA (llama.cpp's GGUF stores Q/K rows
permuted for its interleaved layout; interop/ undoes that permutation).
"""
from __future__ import annotations

import torch
from torch import nn

from attnlab.errors import UserError


class RotaryEmbedding(nn.Module):
    """Computes the cos/sin of the rotation angles for given positions.

    Args:
        head_dim: Dh (must be even). theta: the base θ (10,000 in RoFormer and LLaMA 2;
            500,000 in LLaMA 3; 100,000 in SmolLM2).
    Raises:
        ValueError: for an odd head_dim or a non-positive theta.
    """

    def __init__(self, head_dim: int, theta: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise UserError(f"RoPE needs an even head dim (d_model / n_heads), got {head_dim}")
        if theta <= 0:
            raise UserError(f"rope_theta must be > 0, got {theta}")
        self.head_dim, self.theta = head_dim, theta
        self.register_buffer("inv_freq", self.frequencies(), persistent=False)

    def frequencies(self) -> torch.Tensor:
        """θ^(-2i/Dh) for i = 0 .. Dh/2 − 1: (Dh/2,) fp32 (the inv_freq buffer's values)."""
        return self.theta ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Args:
            positions: (B, T) or (T,) int64 absolute positions (any value >= 0: no table limit).
        Returns:
            (cos, sin), each (B, 1, T, Dh) (or (1, 1, T, Dh)), ready to broadcast over heads.
        """
        if positions.dim() == 1:
            positions = positions[None]
        angles = positions.float()[..., None] * self.inv_freq  # (B, T, Dh/2), in fp32
        angles = torch.cat([angles, angles], dim=-1)[:, None]  # (B, 1, T, Dh)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (−x2, x1) on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate queries or keys: x · cos + rotate_half(x) · sin.

    Args:
        x: (B, H, T, Dh). cos, sin: broadcastable to x, from RotaryEmbedding.
    Returns:
        (B, H, T, Dh), same dtype; the norm of every (i, i + Dh/2) pair is preserved.
    """
    return x * cos + rotate_half(x) * sin
