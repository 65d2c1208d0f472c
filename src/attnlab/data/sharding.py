"""Splitting one global batch across the processes of a distributed run (train/distributed.py).

Every process builds the same list of global batches (the one-process batches of the recipe, from
the same seed); process `rank` of `world` trains on its own contiguous block of each batch's rows
(sentences, sequences, images). The blocks are disjoint and cover the batch, so the processes
together see exactly the one-process batch, and the step count and schedule are unchanged.
"""
from __future__ import annotations

from attnlab.errors import UserError


def shard_rows(n: int, rank: int, world: int) -> range:
    """The rows of process `rank` among `n` rows split over `world` processes: contiguous blocks in
    rank order, sizes differing by at most one (the first n % world processes hold one more).

    Raises:
        ValueError: for n < 0, world < 1 or a rank outside 0..world-1.
    """
    if n < 0 or world < 1 or not 0 <= rank < world:
        raise UserError(f"cannot split {n} rows for rank {rank} of {world} processes")
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def share(n: int, rank: int, world: int) -> tuple[range, float]:
    """(rows, weight) of process `rank`: its shard_rows with weight 1, or, when the batch has fewer
    rows than processes and this one is left without, rank 0's rows with weight 0 — it still runs a
    forward and backward pass (so the collectives of every process match) but adds nothing."""
    rows = shard_rows(n, rank, world)
    if len(rows) == 0:
        return shard_rows(n, 0, world), 0.0
    return rows, 1.0
