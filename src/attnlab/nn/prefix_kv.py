"""A differentiable key/value cache for training on a batch whose rows share a prompt prefix.

Shape legend: B rows, K kv heads, P shared prefix length, T row length after the prefix, Dh head dim.

Instruction data renders every example with the same chat-template opening (a system message, the
instruction's fixed words): in a batch of B rows that share P leading tokens, those P positions are
computed B times for the same result. Computed once instead, a layer's prefix keys and values are
(1, K, P, Dh); each row's own T positions then attend to the prefix's keys expanded to (B, K, P, Dh)
and their own, under the causal mask offset by P. The values are those of the full rows (attention
is the same sum over the same keys, positions P.. as before) up to float rounding, and autograd
runs through the expansion, so the prefix's gradient is the sum of the rows' (the rule of a
broadcast). The saving is (B − 1)·P positions of every layer per step, forward and backward.

Used through GPT.set_kv_caches (one per layer): the first forward (the (1, P) prefix) records the
prefix's keys and values, the next (the (B, T) rows, positions P..P+T−1) gets them expanded in
front of its own. Unlike KVCache nothing is pre-allocated or written in place, so the graph keeps
every tensor; the cache lives for one loss computation. With dropout, the prefix draws one mask that
all rows share.
"""
from __future__ import annotations

import torch


class SharedPrefixKV:
    """KVCache's interface (length, start, window, max_len, reserve, update) for one layer:
    records a (1, K, P, Dh) prefix at the first update, then prepends it, expanded to the batch, to
    the keys/values of every later update (module docstring). Later updates keep nothing, so a layer
    run again on the same rows (activation checkpointing's recomputation) gets the same result.

    Raises:
        ValueError: when the first update (the prefix) has more than one row.
    """

    window = None  # no sliding window
    start = 0      # every key is held

    def __init__(self):
        self.k: torch.Tensor | None = None  # (1, K, P, Dh)
        self.v: torch.Tensor | None = None
        self.length = 0                      # P once the prefix is in: the rows' first position

    @property
    def max_len(self) -> int:
        return 1 << 62  # never full (nothing is pre-allocated)

    def reserve(self, new: int) -> None:
        pass

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """First call: the prefix's k, v (1, K, P, Dh), kept and returned. Later calls: the rows'
        k, v (B, K, T, Dh) -> (B, K, P + T, Dh) each, the prefix expanded in front."""
        if self.k is None:
            if k.size(0) != 1:
                raise ValueError(f"the shared prefix is one row, got {k.size(0)}")
            self.k, self.v, self.length = k, v, k.size(2)
            return k, v
        b = k.size(0)
        keys = torch.cat([self.k.expand(b, -1, -1, -1), k], dim=2)  # (B, K, P + T, Dh)
        values = torch.cat([self.v.expand(b, -1, -1, -1), v], dim=2)
        return keys, values

    def memory_bytes(self) -> int:
        return 0 if self.k is None else 2 * self.k.numel() * self.k.element_size()
