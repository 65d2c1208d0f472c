"""Deterministic seeds for the data pipeline: one integer from a run's seed and positions in it."""
from __future__ import annotations

PRIME = 1_000_003


def mix_seed(seed: int, *parts: int) -> int:
    """((seed·P + parts[0])·P + parts[1])·…, P = 1,000,003 (a prime larger than any epoch or batch
    count here), so distinct (seed, epoch, batch) tuples give distinct generator seeds and a resumed
    run draws the same batches, masks and augmentations as an uninterrupted one.

    Example: mix_seed(seed, epoch) seeds an epoch's order; mix_seed(seed, epoch, batch) one batch.
    """
    value = seed
    for part in parts:
        value = value * PRIME + part
    return value
