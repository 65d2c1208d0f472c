"""Parallel text for translation: reading, tokenizing, token-count batches with length bucketing,
and teacher-forcing tensors.

Shape legend: B sentences in a batch, S source length, T target length (+1 for <bos>/<eos>).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.data.datasets import find_dataset
from attnlab.errors import UserError


def read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 text file without their line endings.

    Raises:
        ValueError: naming the file and byte offset when it is not valid UTF-8.
    """
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not valid UTF-8 at byte offset {e.start}") from None
    return text.splitlines()


def read_parallel(dataset: str, split: str, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    """Aligned source and target sentences of one split; pairs with an empty side are skipped.

    Raises:
        DatasetNotFoundError: when the data set is nowhere on the search path (data/datasets.py).
        ValueError: when the two files have different line counts.
    """
    names = [f"{split}.{src_lang}", f"{split}.{tgt_lang}"]
    root = find_dataset(dataset, names)
    src, tgt = (read_lines(root / n) for n in names)
    if len(src) != len(tgt):
        raise UserError(f"{root}: {names[0]} has {len(src)} lines but {names[1]} has {len(tgt)}")
    pairs = [(s.strip(), t.strip()) for s, t in zip(src, tgt) if s.strip() and t.strip()]
    return [s for s, _ in pairs], [t for _, t in pairs]


@dataclass
class ParallelCorpus:
    """Token ids of aligned sentence pairs (no special tokens: collate adds <bos>/<eos>)."""

    src: list[list[int]]
    tgt: list[list[int]]

    def __len__(self) -> int:
        return len(self.src)

    @classmethod
    def encode(cls, tokenizer, src: list[str], tgt: list[str], max_len: int) -> "ParallelCorpus":
        """Tokenize; sources are cut to max_len tokens and targets to max_len - 1 (room for <bos>/<eos>)."""
        return cls([ids[:max_len] for ids in tokenizer.encode_batch(src)],
                   [ids[:max_len - 1] for ids in tokenizer.encode_batch(tgt)])

    def row_tokens(self) -> list[int]:
        """Each pair's padded length in a batch: max(S, T + 1) (the target gains <bos> / <eos>)."""
        return [max(len(s), len(t) + 1) for s, t in zip(self.src, self.tgt)]

    def target_tokens(self) -> int:
        """Target tokens the model predicts in one epoch (each target + <eos>)."""
        return sum(len(t) + 1 for t in self.tgt)


def token_batches(corpus: ParallelCorpus, batch_tokens: int, seed: int) -> list[list[int]]:
    """Group sentence pairs of similar length into batches of about batch_tokens padded tokens.

    Pairs are shuffled with `seed`, stably sorted by (target, source) length so that equal lengths
    mix differently each epoch, and cut into batches where B · max(S, T + 1) <= batch_tokens; the
    batch order is then shuffled. Same seed, same batches.

    Returns:
        a list of batches, each a list of pair indices.
    """
    rng = random.Random(seed)
    order = list(range(len(corpus)))
    rng.shuffle(order)
    order.sort(key=lambda i: (len(corpus.tgt[i]), len(corpus.src[i])))
    sizes = corpus.row_tokens()
    batches, current, longest = [], [], 0
    for i in order:
        size = sizes[i]
        if current and (len(current) + 1) * max(longest, size) > batch_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def pad_batch(seqs: list[list[int]], pad_id: int) -> torch.Tensor:
    """Right-pad id lists into a (B, max_len) int64 tensor."""
    width = max(1, max(len(s) for s in seqs))
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for row, s in enumerate(seqs):
        out[row, :len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def collate(corpus: ParallelCorpus, indices: list[int], pad_id: int, bos_id: int, eos_id: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher forcing: decoder input <bos> + target, labels target + <eos>.

    Returns:
        (src (B, S), tgt_in (B, T+1), labels (B, T+1)), int64, padded with pad_id.
    """
    src = pad_batch([corpus.src[i] for i in indices], pad_id)
    tgt_in = pad_batch([[bos_id] + corpus.tgt[i] for i in indices], pad_id)
    labels = pad_batch([corpus.tgt[i] + [eos_id] for i in indices], pad_id)
    return src, tgt_in, labels
