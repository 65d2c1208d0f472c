"""The decode-engine contract: per-sequence slots, batched prefill and one batched decoding step.

Shape legend: N sequences in one call, V vocabulary.

An engine owns `max_batch` slots, each the decoding state (KV cache, or recurrent state) of one
sequence of up to `max_len` positions. Sequences in different slots have their own lengths and
positions: a slot's next token sits at position `length(slot)`. One thread drives an engine (the
caller of generate(), or the server's scheduler loop); engines are not thread-safe.

Used by continuous batching (Orca: Yu et al., OSDI 2022; vLLM: Kwon et al., SOSP 2023): at every
step the scheduler admits waiting requests (prefill) and retires finished ones (release), and every
running sequence advances by one token in one `step` call.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class DecodeEngine(Protocol):
    """What generate() and serve/ need of a decode engine.

    Attributes:
        name: the engine's name as reported by benches and the server (e.g. "fused-cpp", "reference").
        max_batch: number of slots (sequences decoded together), slots 0 .. max_batch − 1.
        max_len: positions one slot can hold (prompt + generated tokens).
        vocab_size: V.
    """

    name: str
    max_batch: int
    max_len: int
    vocab_size: int

    def prefill(self, slots: Sequence[int], prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Start a sequence in each free slot: run its prompt (token ids at positions 0 .. len − 1)
        into the slot's state.

        Returns:
            (N, V) float32 logits of the token after each prompt.
        Raises:
            ValueError: a slot out of range or busy, an empty prompt, a prompt longer than max_len,
                a token id outside the vocabulary.
        """
        ...

    def step(self, slots: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        """Append one token to each busy slot (each at its own position) and decode it.

        Returns:
            (N, V) float32 logits of the next token of each slot, in the order given.
        Raises:
            ValueError: a free slot, a slot given twice, a slot full (length == max_len), a bad id.
        """
        ...

    def release(self, slot: int) -> None:
        """Free `slot` (its state is dropped; the slot may be prefilled again). Freeing a free slot
        does nothing."""
        ...

    def length(self, slot: int) -> int:
        """Positions held by `slot` (0 when free)."""
        ...
