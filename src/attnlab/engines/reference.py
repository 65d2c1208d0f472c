"""The reference decode engine: the model's own forward over per-sequence caches.

Shape legend: N sequences in one call, V vocabulary, K kv heads, Dh head dim, W = 1 + the most
positions any of the N slots holds (the width of one batched step).

Runs any decoder-only model of the GPT family (every switch: learned / sinusoidal / RoPE
positions, MoE, sliding window, quantized or bf16 weights) and Mamba, on any device. It is what
the fast engines (engines/fused.py) are tested against, and what generate() falls back to.

    prefill   each prompt in its own batch-1 forward into its slot's caches (in chunks for a
              rolling cache), the logits of its last position.
    step      one batched forward of the N new tokens: the slots' held keys/values are copied
              right-aligned into a (N, K, W, Dh) batch (left padding, as generate() pads prompts),
              the padding masked out of attention and each token at its own position
              (attention_mask, position_ids); the new column is written back into each slot.
              Mamba: the slots' states gathered into one batch and written back.
So a step of N sequences of different lengths equals N batch-1 steps up to fp32 summation order
(tests/engines/test_reference.py).
"""
from __future__ import annotations

from typing import Sequence

import torch

from attnlab.engines.slots import SlotCaches, SlotStates, SlotTable, context_limit
from attnlab.nn.kv_cache import KVCache


class ReferenceEngine:
    """DecodeEngine (engines/base.py) over `model`'s forward.

    Args:
        model: a GPT (models/gpt.py) or Mamba (models/mamba.py) in eval mode.
        max_batch: slots. max_len: positions per slot (prompt + generated).
    Raises:
        ValueError: max_batch or max_len < 1, or max_len past the model's context (context_limit).
    """

    name = "reference"

    def __init__(self, model, max_batch: int, max_len: int):
        self.model = model
        self.max_batch, self.max_len, self.vocab_size = max_batch, max_len, model.cfg.vocab_size
        self.table = SlotTable(max_batch, max_len, self.vocab_size, context_limit(model))
        if model.is_recurrent:
            self.caches, self.states = None, SlotStates(model, max_batch)
        else:
            cfg, p = model.cfg, next(model.parameters())
            self.caches, self.states = SlotCaches(cfg.n_layers, max_batch, cfg.kv_heads, max_len, cfg.head_dim,
                                                  cfg.sliding_window, self._cache_dtype(p), p.device), None

    def _cache_dtype(self, p: torch.Tensor) -> torch.dtype:
        """The dtype of the per-slot caches: the model's (its first parameter's; fp32 for integer ones)."""
        return p.dtype if p.is_floating_point() else torch.float32

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def length(self, slot: int) -> int:
        return self.table.lengths[slot]

    def release(self, slot: int) -> None:
        if 0 <= slot < self.max_batch and self.table.busy[slot]:
            (self.states or self.caches).reset(slot)
        self.table.release(slot)

    def _run(self, decode_state, *args, **kwargs) -> torch.Tensor:
        """model(*args, **kwargs) with `decode_state` as the model's caches (GPT) or states (Mamba);
        the (N, V) fp32 logits of the last position."""
        attr = "states" if self.model.is_recurrent else "caches"
        had, before = hasattr(self.model, attr), getattr(self.model, attr, None)  # a stateless model has none
        setattr(self.model, attr, decode_state)
        try:
            return self.model(*args, logits_to_keep=1, **kwargs).logits[:, -1].float()
        finally:
            if had:
                setattr(self.model, attr, before)
            else:
                delattr(self.model, attr)

    @torch.no_grad()
    def prefill(self, slots: Sequence[int], prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        slots, prompts = self.table.check_prefill(slots, prompts)
        out = []
        for s, prompt in zip(slots, prompts):
            (self.states or self.caches).reset(s)
            views = (self.states or self.caches).views[s]
            ids = torch.tensor([prompt], device=self.device)
            chunk = self._chunk(len(prompt))
            for i in range(0, len(prompt), chunk):
                logits = self._run(views, ids[:, i:i + chunk])
            out.append(logits[0])
            self.table.start(s, len(prompt))
        return torch.stack(out)

    def _chunk(self, n: int) -> int:
        """Most tokens one forward may add to a slot (a rolling cache holds W − 1 old ones beside them)."""
        c = self.caches
        return n if c is None or c.window is None else c.capacity - c.window + 1

    @torch.no_grad()
    def step(self, slots: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        slots, tokens = self.table.check_step(slots, tokens)
        ids = torch.tensor(tokens, device=self.device)[:, None]  # (N, 1)
        if self.states is not None:
            batch = self.states.gather(slots)
            logits = self._run(batch, ids)
            self.states.scatter(slots, batch)
        else:
            logits = self._step_kv(slots, ids)
        for s in slots:
            self.table.lengths[s] += 1
        return logits

    def _step_kv(self, slots: list[int], ids: torch.Tensor) -> torch.Tensor:
        c = self.caches
        for s in slots:
            c.reserve(s, 1)
        held = [c.held(s) for s in slots]
        width = max(held) + 1
        n, (_, kv_heads, _, head_dim) = len(slots), c.k[0].shape
        batch = []
        for layer in range(len(c.k)):
            k = c.k[0].new_zeros(n, kv_heads, width, head_dim)  # (N, K, W, Dh), right-aligned
            v = torch.zeros_like(k)
            for i, (s, h) in enumerate(zip(slots, held)):
                k[i, :, width - 1 - h:width - 1] = c.k[layer][s, :, :h]
                v[i, :, width - 1 - h:width - 1] = c.v[layer][s, :, :h]
            batch.append(KVCache.over(k, v, None, length=width - 1))
        mask = torch.zeros(n, width, dtype=torch.bool, device=ids.device)  # (N, W) True = a held or new key
        for i, h in enumerate(held):
            mask[i, width - 1 - h:] = True
        positions = torch.tensor([[self.table.lengths[s]] for s in slots], device=ids.device)  # (N, 1)
        logits = self._run(batch, ids, mask, positions)
        for layer, cache in enumerate(batch):
            for i, (s, h) in enumerate(zip(slots, held)):
                c.k[layer][s, :, h] = cache.k[i, :, width - 1]
                c.v[layer][s, :, h] = cache.v[i, :, width - 1]
        for s in slots:
            c.advance(s, 1)
        return logits
