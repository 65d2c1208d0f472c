"""Perplexity of a mean NLL (the label-smoothed cross-entropy itself: nn/cross_entropy.py)."""
from __future__ import annotations

import math

MAX_PERPLEXITY_NLL = 50.0  # nats: a diverged model's perplexity is reported as e^50 (≈ 5.2e21)


def perplexity(nll: float) -> float:
    """exp(nll) with nll capped at MAX_PERPLEXITY_NLL, so that a diverged model's record stays a finite
    JSON number (exp overflows past 709 nats)."""
    return math.exp(min(nll, MAX_PERPLEXITY_NLL))
