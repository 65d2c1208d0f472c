"""Instruction pairs as tokens for supervised fine-tuning: prompt + response per example, batches of
similar length, and right-padded tensors whose loss covers the response tokens only.

Shape legend: B examples in a batch, P prefix the batch's prompts share, T longest row after it.

An example is a prompt (the chat template's rendering of the instruction, up to and including the
opening of the assistant's turn) and a response (the answer and the template's end-of-turn token),
tokenized separately: the model sees exactly the prompt tokens it will see at generation, then
learns to continue them with the response and to stop. Inputs are prompt + response without its
last token, targets the same shifted by one; only targets inside the response count in the loss
(the prompt's tokens carry none: Ouyang et al. 2022, §3.5's supervised fine-tuning on
demonstrations; TRL's completion-only loss). The batch's longest shared prompt prefix (the chat
template's fixed opening, the instruction's fixed words) can be split off to be computed once
(nn/prefix_kv.py); it always leaves each row its last prompt token, so no target lies in it.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch


@dataclass
class InstructionExamples:
    """Tokenized examples: prompts[i] then responses[i] (both non-empty)."""

    prompts: list[list[int]]
    responses: list[list[int]]

    def __len__(self) -> int:
        return len(self.prompts)

    def lengths(self) -> list[int]:
        """Tokens per example (prompt + response)."""
        return [len(p) + len(r) for p, r in zip(self.prompts, self.responses)]

    def response_tokens(self) -> int:
        """Tokens the loss covers in one epoch."""
        return sum(map(len, self.responses))

    @classmethod
    def encode(cls, tokenizer, prompts: list[str], responses: list[str], stop_id: int | None,
               max_len: int) -> tuple["InstructionExamples", int]:
        """Tokenize rendered (prompt, response) texts (special tokens such as <|im_end|> as their ids);
        a response is cut after its first `stop_id` (what a template writes after the end-of-turn
        token is never generated); examples longer than max_len tokens, or with an empty side, are
        left out.

        Returns:
            (the examples, how many were left out).
        """
        p_ids = tokenizer.encode_batch(prompts, allowed_special="all")
        r_ids = tokenizer.encode_batch(responses, allowed_special="all")
        kept_p, kept_r = [], []
        for p, r in zip(p_ids, r_ids):
            if stop_id is not None and stop_id in r:
                r = r[:r.index(stop_id) + 1]
            if p and r and len(p) + len(r) <= max_len:
                kept_p.append(p)
                kept_r.append(r)
        return cls(kept_p, kept_r), len(prompts) - len(kept_p)


def length_batches(lengths: list[int], batch_tokens: int, seed: int) -> list[list[int]]:
    """Examples of similar length grouped into batches of at most batch_tokens padded tokens (at
    least one example each): shuffled with `seed`, stably sorted by length, cut where
    B · max(length) would pass batch_tokens, the batches then shuffled. Same seed, same batches.

    Returns:
        a list of batches, each a list of example indices.
    """
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    order.sort(key=lambda i: lengths[i])
    batches, current, longest = [], [], 0
    for i in order:
        if current and (len(current) + 1) * max(longest, lengths[i]) > batch_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, lengths[i])
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


@dataclass
class InstructionBatch:
    """One batch, split as prefix + rows (module docstring)."""

    prefix: torch.Tensor   # (P,) int64 tokens every row starts with (P may be 0)
    ids: torch.Tensor      # (B, T) int64 input tokens after the prefix, right-padded
    targets: torch.Tensor  # (B, T) int64 next tokens (pad_id where none)
    keep: torch.Tensor     # (B, T) bool: targets in the response, the loss's positions

    @property
    def n_targets(self) -> int:
        return int(self.keep.sum())


def common_prefix(rows: list[list[int]]) -> int:
    """Length of the longest prefix all `rows` share."""
    first, n = rows[0], min(map(len, rows))
    for i in range(n):
        if any(r[i] != first[i] for r in rows):
            return i
    return n


def collate(examples: InstructionExamples, indices: list[int], pad_id: int, share_prefix: bool = True
            ) -> InstructionBatch:
    """The batch of examples `indices`: inputs prompt + response[:-1], targets shifted by one, loss
    on the response's tokens; with share_prefix, the prompts' common prefix (at most the shortest
    prompt − 1 tokens) as its own (P,) tensor."""
    prompts = [examples.prompts[i] for i in indices]
    full = [p + examples.responses[i] for p, i in zip(prompts, indices)]
    p = min(common_prefix(prompts), min(map(len, prompts)) - 1) if share_prefix else 0
    width = max(len(f) for f in full) - 1 - p
    ids = torch.full((len(full), width), pad_id, dtype=torch.long)
    targets = torch.full((len(full), width), pad_id, dtype=torch.long)
    keep = torch.zeros(len(full), width, dtype=torch.bool)
    for row, (prompt, seq) in enumerate(zip(prompts, full)):
        n = len(seq) - 1 - p  # this row's inputs after the prefix
        ids[row, :n] = torch.tensor(seq[p:-1])
        targets[row, :n] = torch.tensor(seq[p + 1:])
        keep[row, len(prompt) - 1 - p:n] = True  # the target at input position t is token t + 1
    return InstructionBatch(torch.tensor(full[0][:p], dtype=torch.long), ids, targets, keep)
