"""Pre-allocated key/value cache for one attention layer (autoregressive decoding).

Shape legend: B batch, K kv heads, T new tokens, L cache capacity, Dh head dim.
With a sliding window W the cache rolls: when full it keeps only the W − 1 most recent
positions (all a later query can see), so memory stays O(L) however long the text grows.
"""
from __future__ import annotations

import torch

from attnlab.errors import UserError


class KVCache:
    """Keys and values of the tokens decoded so far, in tensors allocated once.

    Stores only the n_kv_heads heads (grouped-query attention shares them across query heads).
    `length` counts every position appended so far (the absolute position of the next token);
    `start` is the absolute position of the oldest key still held (0 unless the cache rolled).

    Args:
        batch_size: B. n_kv_heads: K. max_len: L, the capacity in positions. head_dim: Dh.
        dtype, device: of the stored tensors.
        window: sliding window W (None = no window: appending past L is an error).
    Raises:
        ValueError: if a window is given that is larger than max_len.
    """

    def __init__(self, batch_size: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 window: int | None = None):
        if window is not None and not 1 <= window <= max_len:
            raise UserError(f"a rolling KV cache needs 1 <= window <= max_len={max_len}, got {window}")
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (B, K, L, Dh)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (B, K, L, Dh)
        self.window = window
        self.length = 0
        self.start = 0

    @classmethod
    def over(cls, k: torch.Tensor, v: torch.Tensor, window: int | None = None, length: int = 0,
             start: int = 0) -> KVCache:
        """A cache held in given (B, K, L, Dh) tensors (e.g. views of one row of an engine's
        per-sequence storage: decode engines give each sequence its own cache in one tensor), holding
        positions start .. length − 1 in its first length − start slots.

        Raises:
            ValueError: k and v of different shapes, a window as in the constructor, or more
                positions held than L.
        """
        if k.shape != v.shape or k.dim() != 4:
            raise UserError(f"k and v must be (B, K, L, Dh) of one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        if window is not None and not 1 <= window <= k.size(2):
            raise UserError(f"a rolling KV cache needs 1 <= window <= max_len={k.size(2)}, got {window}")
        if not 0 <= length - start <= k.size(2) or start < 0:
            raise UserError(f"a cache of {k.size(2)} slots cannot hold positions {start} .. {length - 1}")
        cache = cls.__new__(cls)
        cache.k, cache.v, cache.window, cache.length, cache.start = k, v, window, length, start
        return cache

    @property
    def max_len(self) -> int:
        return self.k.size(2)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new keys/values and return all cached ones.

        Args:
            k, v: (B, K, T, Dh) for the T new tokens.
        Returns:
            (k_all, v_all), each (B, K, length + T − start, Dh): the keys of absolute positions
            start .. length + T − 1, views into the cache.
        Raises:
            ValueError: when the cache would overflow max_len (no window), or when T new tokens do
                not fit beside the W − 1 kept ones (feed at most max_len − W + 1 at a time).
        """
        new = k.size(2)
        self.reserve(new)
        held = self.length - self.start
        self.k[:, :, held:held + new] = k
        self.v[:, :, held:held + new] = v
        self.length += new
        return self.k[:, :, :held + new], self.v[:, :, :held + new]

    def reserve(self, new: int) -> None:
        """Make room for `new` more positions (rolling a windowed cache), so that `start` is final
        before the attention mask is built. update() calls it too; a second call does nothing.

        Raises:
            ValueError: as update().
        """
        held = self.length - self.start
        if held + new > self.max_len:
            if self.window is None:
                raise UserError(f"KV cache overflow: {self.length + new} tokens > max_len={self.max_len}")
            keep = min(self.window - 1, held)
            if keep + new > self.max_len:
                raise UserError(f"{new} new tokens do not fit a rolling KV cache of {self.max_len} positions "
                                f"with window {self.window}; feed at most {self.max_len - self.window + 1} at a time")
            self.k[:, :, :keep] = self.k[:, :, held - keep:held].clone()
            self.v[:, :, :keep] = self.v[:, :, held - keep:held].clone()
            self.start = self.length - keep

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` (B',) int64, e.g. the surviving hypotheses of beam search."""
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)

    def memory_bytes(self) -> int:
        """Bytes held by the cache tensors."""
        return self.k.numel() * self.k.element_size() * 2
