"""What every decode engine keeps per slot: the checks of the contract (base.py) and the
per-sequence KV caches of an attention model, one tensor per layer for all slots.

Shape legend: N sequences in one call, S slots (max_batch), L layers, K kv heads, C cache capacity
(positions held per slot), Dh head dim.

Each slot's keys and values live in row `slot` of one (S, K, C, Dh) tensor per layer; the slot is
seen through batch-1 KVCache views of that row (nn/kv_cache.py), so a model's own forward fills it
(prefill) and a C++ step reads and writes the same memory (engines/fused.py). Slots have their own
lengths: slot s holds positions start_s .. length_s − 1 in its first length_s − start_s rows.
With a sliding window W the capacity is min(max_len, 2W) and a slot rolls on its own (KVCache.reserve).
"""
from __future__ import annotations

from typing import Sequence

import torch

from attnlab.errors import UserError
from attnlab.nn.kv_cache import KVCache


def context_limit(model) -> int | None:
    """Most positions one sequence of `model` may hold in a decode state: None (no limit) for a
    recurrent model (Mamba: a constant-size state) and for a sliding window with RoPE (a rolling
    cache, no position table); otherwise cfg.max_seq_len (the learned / sinusoidal table's rows, or
    RoPE's trained length)."""
    cfg = model.cfg
    if model.is_recurrent or (getattr(cfg, "sliding_window", None) is not None and cfg.positions == "rope"):
        return None
    return cfg.max_seq_len


class SlotTable:
    """Which slots are busy and how long each is, with the contract's checks (ValueError)."""

    def __init__(self, max_batch: int, max_len: int, vocab_size: int, limit: int | None):
        if max_batch < 1:
            raise UserError(f"max_batch must be >= 1, got {max_batch}")
        if max_len < 1:
            raise UserError(f"max_len must be >= 1, got {max_len}")
        if limit is not None and max_len > limit:
            raise UserError(f"max_len={max_len} is past the model's context of {limit} positions (max_seq_len)")
        self.max_batch, self.max_len, self.vocab_size = max_batch, max_len, vocab_size
        self.lengths = [0] * max_batch
        self.busy = [False] * max_batch

    def _slots(self, slots: Sequence[int]) -> list[int]:
        slots = [int(s) for s in slots]
        for s in slots:
            if not 0 <= s < self.max_batch:
                raise UserError(f"slot {s} is out of range 0 .. {self.max_batch - 1}")
        if len(set(slots)) != len(slots):
            raise UserError(f"a slot is given twice: {slots}")
        return slots

    def _token(self, t: int) -> int:
        if not 0 <= int(t) < self.vocab_size:
            raise UserError(f"token id {int(t)} is outside the vocabulary 0 .. {self.vocab_size - 1}")
        return int(t)

    def check_prefill(self, slots: Sequence[int], prompts: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
        slots = self._slots(slots)
        if len(slots) != len(prompts):
            raise UserError(f"{len(slots)} slots for {len(prompts)} prompts")
        out = []
        for s, p in zip(slots, prompts):
            if self.busy[s]:
                raise UserError(f"slot {s} is busy (release it first)")
            if len(p) < 1:
                raise UserError("every prompt needs at least one token (an empty prompt has nothing to continue)")
            if len(p) > self.max_len:
                raise UserError(f"a prompt of {len(p)} tokens does not fit max_len={self.max_len}")
            out.append([self._token(t) for t in p])
        return slots, out

    def check_step(self, slots: Sequence[int], tokens: Sequence[int]) -> tuple[list[int], list[int]]:
        slots = self._slots(slots)
        if len(slots) != len(tokens):
            raise UserError(f"{len(slots)} slots for {len(tokens)} tokens")
        for s in slots:
            if not self.busy[s]:
                raise UserError(f"slot {s} is free (prefill it first)")
            if self.lengths[s] >= self.max_len:
                raise UserError(f"slot {s} is full ({self.lengths[s]} positions = max_len)")
        return slots, [self._token(t) for t in tokens]

    def start(self, slot: int, length: int) -> None:
        self.busy[slot], self.lengths[slot] = True, length

    def release(self, slot: int) -> None:
        if 0 <= slot < self.max_batch:
            self.busy[slot], self.lengths[slot] = False, 0


class SlotCaches:
    """Per-slot KV caches of an attention model: k[l], v[l] (S, K, C, Dh) per layer, and for each
    slot the batch-1 KVCache views of its row (views[slot][layer])."""

    def __init__(self, n_layers: int, max_batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 window: int | None, dtype: torch.dtype, device: torch.device):
        capacity = min(max_len, 2 * window) if window is not None else max_len
        self.window = window if window is not None and window < capacity else None
        shape = (max_batch, n_kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]  # (S, K, C, Dh)
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.views = [[KVCache.over(k[s:s + 1], v[s:s + 1], self.window) for k, v in zip(self.k, self.v)]
                      for s in range(max_batch)]

    @property
    def capacity(self) -> int:
        return self.k[0].size(2)

    def held(self, slot: int) -> int:
        """Rows of the slot's caches in use (length − start)."""
        c = self.views[slot][0]
        return c.length - c.start

    def reserve(self, slot: int, new: int) -> None:
        """Make room for `new` positions in every layer of `slot` (rolling a windowed cache)."""
        first = self.views[slot][0]
        if first.length - first.start + new > self.capacity:
            for cache in self.views[slot]:
                cache.reserve(new)

    def advance(self, slot: int, new: int) -> None:
        """Count `new` positions written (by a C++ step) into every layer of `slot`."""
        for cache in self.views[slot]:
            cache.length += new

    def reset(self, slot: int) -> None:
        for cache in self.views[slot]:
            cache.length = cache.start = 0

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class SlotStates:
    """Per-slot recurrent states of a Mamba model: one MambaState of S rows per layer, and for each
    slot the batch-1 MambaState views of its row (views[slot][layer]). A recurrent model whose
    setup_kv_cache leaves no `states` (its next token needs none) has no layers here."""

    def __init__(self, model, max_batch: int):
        model.setup_kv_cache(max_batch, 1)
        # (S, Di, K) conv, (S, Di, N) ssm per layer; none for a model whose next token needs no state
        self.states, model.states = getattr(model, "states", None) or [], None
        self.views = [[self._row(st, s) for st in self.states] for s in range(max_batch)]

    @staticmethod
    def _row(state, s: int):
        view = type(state).__new__(type(state))
        view.conv, view.ssm, view.length = state.conv[s:s + 1], state.ssm[s:s + 1], 0
        return view

    def gather(self, slots: list[int]) -> list:
        """Batch-N copies of the slots' states, rows in the order of `slots`."""
        if not self.states:
            return []
        index = torch.tensor(slots, device=self.states[0].ssm.device)
        out = []
        for st in self.states:
            view = type(st).__new__(type(st))
            view.conv, view.ssm, view.length = st.conv.index_select(0, index), st.ssm.index_select(0, index), 0
            out.append(view)
        return out

    def scatter(self, slots: list[int], batch: list) -> None:
        """Write batch-N states back into the slots' rows."""
        if not self.states:
            return
        index = torch.tensor(slots, device=self.states[0].ssm.device)
        for st, b in zip(self.states, batch):
            st.conv.index_copy_(0, index, b.conv)
            st.ssm.index_copy_(0, index, b.ssm)

    def reset(self, slot: int) -> None:
        for view in self.views[slot]:
            view.conv.zero_()
            view.ssm.zero_()
            view.length = 0
