"""Pre-allocated key/value cache for one attention layer (autoregressive decoding).

Shape legend: B batch, K kv heads, T new tokens, L max cached length, Dh head dim.
"""
from __future__ import annotations

import torch


class KVCache:
    """Keys and values of the tokens decoded so far, in tensors allocated once.

    Stores only the n_kv_heads heads (grouped-query attention shares them across query heads).

    Args:
        batch_size: B. n_kv_heads: K. max_len: L. head_dim: Dh.
        dtype, device: of the stored tensors.
    """

    def __init__(self, batch_size: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (B, K, L, Dh)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (B, K, L, Dh)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.size(2)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new keys/values and return all cached ones.

        Args:
            k, v: (B, K, T, Dh) for the T new tokens.
        Returns:
            (k_all, v_all), each (B, K, length + T, Dh), views into the cache.
        Raises:
            ValueError: when the cache would overflow max_len.
        """
        end = self.length + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: {end} tokens > max_len={self.max_len}")
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` (B',) int64, e.g. the surviving hypotheses of beam search."""
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)

    def memory_bytes(self) -> int:
        """Bytes held by the cache tensors."""
        return self.k.numel() * self.k.element_size() * 2
