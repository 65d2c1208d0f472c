"""Sentence classification data (SST-2) and the sentences BERT pretrains on.

Shape legend: B sentences, S tokens.
"""
from __future__ import annotations

import torch

from attnlab.data.datasets import find_dataset
from attnlab.errors import UserError
from attnlab.seeding import mix_seed

SST2_LABELS = ["negative", "positive"]


def read_sst2(split: str) -> tuple[list[str], list[int]]:
    """Sentences and labels (0 negative, 1 positive) of SST-2 "train" or "dev" (GLUE's files; the
    test split has no labels).

    Raises:
        ValueError: for another split, or a malformed line (naming the file and line).
    """
    if split not in ("train", "dev"):
        raise UserError(f"unknown SST-2 split {split!r}; known: train, dev (GLUE's test set has no labels)")
    path = find_dataset("sst2", [f"{split}.tsv"]) / f"{split}.tsv"
    sentences, labels = [], []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines()[1:], 2):
        text, sep, label = line.rpartition("\t")
        if not sep or label.strip() not in ("0", "1"):
            raise UserError(f"{path}:{n}: expected 'sentence<TAB>0|1', got {line[:60]!r}")
        sentences.append(text.strip())
        labels.append(int(label))
    return sentences, labels


def pad_batch(ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists: ((B, S) int64 ids, (B, S) int64 attention mask, 1 = real token)."""
    width = max(map(len, ids))
    out = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for i, row in enumerate(ids):
        out[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, :len(row)] = 1
    return out, mask


def length_grouped_batches(lengths: list[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Batches of sentence indices for `epoch`: seeded and shuffled, sorted by length inside groups of
    50 batches (less padding), the batches themselves in a seeded random order."""
    g = torch.Generator().manual_seed(mix_seed(seed, epoch))
    order = torch.randperm(len(lengths), generator=g).tolist()
    group = batch_size * 50
    batches = []
    for start in range(0, len(order), group):
        chunk = sorted(order[start:start + group], key=lambda i: lengths[i])
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    perm = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in perm]
