"""Masked-language-model inputs: BERT's 15% / 80-10-10 masking.

Shape legend: B sentences, S tokens, V vocabulary.
"""
from __future__ import annotations

import torch

IGNORE = -100  # label of positions that are not predicted (cross_entropy's ignore_index)


def mask_tokens(input_ids: torch.Tensor, eligible: torch.Tensor, mask_id: int, vocab_size: int,
                probability: float = 0.15, generator: torch.Generator | None = None,
                random_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose `probability` of the eligible tokens to predict; of those, 80% become [MASK], 10% a
    random token and 10% stay as they are. Special and padding tokens are never eligible.

    Args:
        input_ids: (B, S) int64. eligible: (B, S) bool, True for ordinary (non-special, non-pad) tokens.
        mask_id: id of [MASK]. vocab_size: V. probability: the selection rate (BERT: 0.15).
        generator: seeds the draws. random_ids: (R,) ids the random replacement draws from
            (default: all of 0..V−1; pass the ordinary tokens to avoid drawing special ones).
    Returns:
        (inputs (B, S) with the replacements, labels (B, S): the original id where chosen, −100 elsewhere).
    Source: Devlin et al. 2019, "BERT", §3.1 (Task #1: Masked LM) and Appendix C.2.
    """
    chosen = (torch.rand(input_ids.shape, generator=generator) < probability) & eligible
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE))
    action = torch.rand(input_ids.shape, generator=generator)  # < 0.8 mask, < 0.9 random, else keep
    inputs = input_ids.clone()
    inputs[chosen & (action < 0.8)] = mask_id
    replace = chosen & (action >= 0.8) & (action < 0.9)
    if random_ids is None:
        draws = torch.randint(vocab_size, input_ids.shape, generator=generator)
    else:
        draws = random_ids[torch.randint(len(random_ids), input_ids.shape, generator=generator)]
    inputs[replace] = draws[replace]
    return inputs, labels
