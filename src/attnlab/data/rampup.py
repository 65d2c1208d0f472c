"""Batch-size warm-up ("ramp-up"): the run's first batches are smaller, growing to the full size.

Early in training the gradient noise is small next to the gradient (the "critical batch size" is
small when the loss is high, McCandlish et al. 2018, "An Empirical Model of Large-Batch Training"),
so small batches learn about as much per token as large ones, and take less time per step: a short
budget buys more optimizer steps. GPT-3 ramps its batch linearly over the first tokens of the run
(Brown et al. 2020, §2.3 and Appendix B); Megatron-LM's --rampup-batch-size does the same in samples.

Here the epoch's full-size batches (already bucketed by length and shuffled) are cut, while the ramp
lasts, into row-contiguous pieces of at most the cap of the moment, in padded tokens. The result is
a function of the batches alone, so a resumed run sees the same list (train/loop.py keeps its
position in it).
"""
from __future__ import annotations

import math
from collections.abc import Sequence


def rampup_cap(index: int, start_tokens: int, full_tokens: int, rampup: int) -> float:
    """The cap, in padded tokens, of the run's batch number `index` (0-based) under a linear
    ramp from start_tokens (batch 0) to full_tokens (batch `rampup` on).

    Raises:
        ValueError: when index < 0 or not 0 < start_tokens <= full_tokens.
    """
    if index < 0:
        raise ValueError(f"batch index must be >= 0, got {index}")
    if not 0 < start_tokens <= full_tokens:
        raise ValueError(f"need 0 < start_tokens <= full_tokens, got {start_tokens} and {full_tokens}")
    if index >= rampup:
        return float(full_tokens)
    return start_tokens + (full_tokens - start_tokens) * index / rampup


def rampup_batches(batches: Sequence[list[int]], sizes: Sequence[int], start_tokens: int, full_tokens: int,
                   rampup: int) -> list[list[int]]:
    """Cut the first batches of a run so that their padded size follows a linear ramp.

    Each batch in turn, while fewer than `rampup` batches have been emitted, is cut into
    k = ceil(padded / cap) row-contiguous pieces of near-equal rows (padded = rows · the longest
    example's size; cap = rampup_cap of the first piece's index); the rest are kept whole. A batch
    never grows, and no example is dropped or repeated.

    Args:
        batches: lists of example indices (e.g. data/translation.token_batches, one epoch).
        sizes: sizes[i] = example i's padded length (tokens per row it needs).
        start_tokens, full_tokens: the cap at batch 0 and after the ramp (full_tokens is the batches'
            own size limit).
        rampup: number of batches the ramp lasts; 0 returns the batches unchanged.
    Returns:
        the new list of batches (the same examples in the same order, some batches split).
    Raises:
        ValueError: when rampup < 0, or when rampup > 0 and not 0 < start_tokens <= full_tokens.
    """
    if rampup < 0:
        raise ValueError(f"rampup must be >= 0, got {rampup}")
    out: list[list[int]] = []
    for batch in batches:
        if len(out) >= rampup or len(batch) < 2:
            out.append(list(batch))
            continue
        padded = len(batch) * max(sizes[i] for i in batch)
        pieces = min(len(batch), math.ceil(padded / rampup_cap(len(out), start_tokens, full_tokens, rampup)))
        for p in range(pieces):
            out.append(list(batch[p * len(batch) // pieces:(p + 1) * len(batch) // pieces]))
    return out
