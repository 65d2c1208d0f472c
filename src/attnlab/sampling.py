"""The sampling chain of autoregressive generation: logits → temperature → top-k → top-p → sample.

Shape legend: B sequences, V vocabulary.
"""
from __future__ import annotations

import torch

from attnlab.errors import UserError


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise ValueError naming the argument when temperature < 0, top_k < 1 or top_p outside (0, 1]."""
    if not temperature >= 0:  # also catches NaN
        raise UserError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise UserError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise UserError(f"top_p must be in (0, 1], got {top_p}")


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row, −inf elsewhere (ties at the k-th value are kept).

    Args: logits (B, V). Returns: (B, V). Source: Fan et al. 2018, "Hierarchical Neural Story
    Generation", §5 (top-k sampling).
    """
    k = min(k, logits.size(-1))
    kth = logits.topk(k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of most probable tokens whose probability sums to
    at least p, −inf elsewhere. The most probable token is always kept, for every dtype and every
    p in (0, 1] (ties: the one that sorts first), so the result can always be sampled from.

    The probabilities and their running sum are computed in float32 (float64 stays float64): in
    fp16/bf16, or against a p below the dtype's smallest number (1e-46 is 0 in float32), the test
    "mass before this token >= p" would otherwise drop every token.

    Args: logits (B, V) of any floating dtype; p in (0, 1] (check_sampling validates it).
    Returns: (B, V), the logits' dtype, the dropped entries −inf.
    Source: Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", §3.1, equation (2);
        Hugging Face's TopPLogitsWarper likewise always keeps at least one token (min_tokens_to_keep=1).
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
    probs = sorted_logits.to(torch.promote_types(logits.dtype, torch.float32)).softmax(dim=-1)  # (B, V)
    before = probs.cumsum(dim=-1).roll(1, dims=-1)  # (B, V) mass of the more probable tokens
    drop_sorted = before >= p
    drop_sorted[..., 0] = False  # the most probable token, always kept (the roll put the total mass there)
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick the next token of each row.

    temperature 0 is greedy (argmax); otherwise logits / temperature are filtered by top-k then
    top-p and one token is drawn from the softmax with `generator` (seeded = reproducible). A
    temperature so small that logits / temperature overflows float32 (below ~1e-35 for logits of
    ~1e3; 1e-300 is 0 in float32) divides the gaps to each row's largest logit instead, with the
    temperature at least float32's smallest normal: the largest gets 0, the others −inf or far
    below, so the draw is the argmax (a uniform draw among tied maxima), T → 0's limit, not NaN.

    Args:
        logits: (B, V) next-token logits.
    Returns:
        (B,) int64 token ids.
    Raises:
        ValueError: for an invalid temperature, top_k or top_p (see check_sampling).
    """
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float()  # (B, V)
    scaled = logits / temperature
    if not bool(torch.isfinite(scaled.amax(dim=-1)).all()):  # overflow (or a temperature that is 0 in float32)
        gaps = logits - logits.amax(dim=-1, keepdim=True)  # (B, V), <= 0
        scaled = gaps / max(temperature, torch.finfo(torch.float32).tiny)
    logits = scaled
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None and top_p < 1:
        logits = top_p_filter(logits, top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)
