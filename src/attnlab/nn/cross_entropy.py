"""Label-smoothed cross-entropy: the training loss of every family (the reference composition;
nn/linear_cross_entropy.py fuses it with the output projection).

Shape legend: N positions, V vocabulary.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def label_smoothed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, epsilon: float,
                                 ignore_index: int = -100, pad_id: int | None = None,
                                 reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy against q = (1 − ε)·one_hot(y) + ε·uniform.

    Positions whose label is ignore_index (or pad_id) count in neither term. The uniform
    distribution spreads ε over the V − 1 classes other than pad_id, so the model is never taught
    to emit padding (Vaswani et al. 2017, §5.4; Szegedy et al. 2016, §7). With pad_id None it
    spreads over all V classes. Uniform logits give ln V for any ε.

    Args:
        logits: (N, V) or (..., V) float. labels: (N,) or (...) int64.
        epsilon: ε_ls in [0, 1). ignore_index: label value to skip. pad_id: padding id (also skipped).
        reduction: "mean" over counted positions, or "sum".
    Returns:
        scalar float tensor (0 when no position counts).
    """
    logits = logits.reshape(-1, logits.size(-1))
    labels = labels.reshape(-1)
    keep = labels != ignore_index
    if pad_id is not None:
        keep &= labels != pad_id
    n = int(keep.sum())
    if n < keep.numel():  # a copy of the (N, V) logits only when some position does not count
        logits, labels = logits[keep], labels[keep]
    logp = F.log_softmax(logits.float(), dim=-1)  # (N, V)
    nll = -logp.gather(1, labels[:, None]).squeeze(1)  # (N,)
    if epsilon > 0:
        if pad_id is None:
            smooth = -logp.mean(dim=-1)
        else:
            smooth = -(logp.sum(dim=-1) - logp[:, pad_id]) / (logp.size(-1) - 1)
        loss = (1.0 - epsilon) * nll + epsilon * smooth
    else:
        loss = nll
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / max(n, 1)
