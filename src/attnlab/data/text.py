"""Language-model data: one long text, split into train/validation, tokenized once, cut into blocks.

Shape legend: B sequences per batch, T block size (tokens per sequence).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.data.datasets import find_dataset
from attnlab.errors import UnknownName, UserError
from attnlab.tokenizers import ByteLevelBPE

TEXT_FILES = {"tinyshakespeare": "input.txt"}


def read_text(dataset: str) -> str:
    """The whole text of a data set (UTF-8).

    Raises:
        KeyError: for a data set that is not a text corpus. DatasetNotFoundError: when it is missing.
    """
    if dataset not in TEXT_FILES:
        raise UnknownName(f"{dataset!r} is not a text data set; known: {sorted(TEXT_FILES)}")
    name = TEXT_FILES[dataset]
    return (find_dataset(dataset, [name]) / name).read_text(encoding="utf-8")


def split_text(text: str, train_fraction: float) -> tuple[str, str]:
    """The first `train_fraction` of the characters, and the rest (nanoGPT's 90/10 split)."""
    cut = int(len(text) * train_fraction)
    return text[:cut], text[cut:]


def char_tokenizer(text: str) -> ByteLevelBPE:
    """A character-level tokenizer: one token per distinct byte of `text`, no merges.

    For ASCII text such as Tiny Shakespeare (65 distinct characters) this is exactly the
    character vocabulary of char-rnn and nanoGPT, ids in byte order. It is a ByteLevelBPE without
    merges, so it saves and loads as an ordinary tokenizer.json; bytes it has never seen are dropped
    when encoding (as HF's BPE does without an unknown token).
    """
    alphabet = sorted(set(text.encode("utf-8")))
    return ByteLevelBPE({i: bytes([b]) for i, b in enumerate(alphabet)}, [])


@dataclass
class TokenStream:
    """A tokenized text as one (N,) int64 tensor, with random-block batches and sequential blocks."""

    ids: torch.Tensor

    def __len__(self) -> int:
        return self.ids.numel()

    def check_block(self, block_size: int, what: str) -> None:
        if len(self) < block_size + 1:
            raise UserError(f"the {what} text has {len(self)} tokens, fewer than block_size + 1 = {block_size + 1}")

    def random_offsets(self, n_batches: int, batch_size: int, block_size: int, generator: torch.Generator
                       ) -> torch.Tensor:
        """(n_batches, B) int64 start offsets drawn uniformly, as nanoGPT's get_batch."""
        return torch.randint(len(self) - block_size, (n_batches, batch_size), generator=generator)

    def blocks(self, offsets: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets for (B,) offsets: each (B, T) int64 (teacher forcing)."""
        index = offsets[:, None] + torch.arange(block_size + 1)  # (B, T + 1)
        seq = self.ids[index]
        return seq[:, :-1], seq[:, 1:]

    def sequential_blocks(self, block_size: int, batch_size: int = 64, max_tokens: int | None = None):
        """Non-overlapping (inputs, targets) blocks covering the stream once, for evaluation.

        Yields batches of up to `batch_size` full blocks, each pair (b, T) int64, then the remainder as
        one (1, t) pair; at most max_tokens targets in all (None = the whole stream).
        """
        end = len(self) - 1 if max_tokens is None else min(len(self) - 1, max_tokens)
        n_full = end // block_size
        x = self.ids[:n_full * block_size].view(n_full, block_size)  # (N, T)
        y = self.ids[1:n_full * block_size + 1].view(n_full, block_size)  # (N, T)
        for i in range(0, n_full, batch_size):
            yield x[i:i + batch_size], y[i:i + batch_size]
        if end > n_full * block_size:
            yield self.ids[n_full * block_size:end][None], self.ids[n_full * block_size + 1:end + 1][None]
