"""Sparse mixture-of-experts FFN: a router picks top_k of E expert FFNs per token.

Shape legend: B batch, T length, D model dim, F expert hidden dim, E experts, N = B·T tokens,
k experts per token (top_k).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.mlp import make_ffn


def load_balancing_loss(router_probs: torch.Tensor, expert_index: torch.Tensor, n_experts: int) -> torch.Tensor:
    """The Switch Transformer auxiliary loss E · Σ_i f_i · P_i.

    f_i is the fraction of (token, choice) slots sent to expert i and P_i the mean router
    probability of expert i. It equals top_k when routing is perfectly balanced and grows as the
    router favours a few experts; only P carries a gradient.

    Args:
        router_probs: (N, E) softmax of the router logits. expert_index: (N, k) chosen experts.
    Returns:
        () scalar.
    Source: Fedus et al. 2021, "Switch Transformers", §2.2, equations (4)–(6); with top_k > 1 as
        in Hugging Face's Mixtral (f summed over the k choices).
    """
    chosen = F.one_hot(expert_index, n_experts).float()  # (N, k, E)
    fraction = chosen.mean(dim=0)  # (k, E): share of tokens whose j-th choice is expert i
    mean_prob = router_probs.float().mean(dim=0)  # (E,)
    return n_experts * (fraction * mean_prob).sum()


class MixtureOfExperts(nn.Module):
    """y = Σ_{i ∈ top_k(router(x))} g_i(x) · Expert_i(x), with g the top-k softmax weights renormalised
    to sum to 1 (Mixtral). Each expert is an FFN (ReLU, GELU or SwiGLU).

    Args:
        d_model: D. d_ff: F of each expert. n_experts: E. top_k: k (1 <= k <= E).
        activation: the experts' FFN kind. dropout, bias: passed to each expert.
    Raises:
        ValueError: when top_k is not in 1..n_experts.
    Source: Shazeer et al. 2017, "Outrageously Large Neural Networks" (sparsely-gated MoE);
        Jiang et al. 2024, "Mixtral of Experts", §2.1, equation (1)–(2).
    """

    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int, activation: str = "swiglu",
                 dropout: float = 0.0, bias: bool = False):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"moe_top_k must be in 1..n_experts={n_experts}, got {top_k}")
        self.n_experts, self.top_k = n_experts, top_k
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(make_ffn(d_model, d_ff, activation, dropout, bias) for _ in range(n_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Args:
            x: (B, T, D).
        Returns:
            (y (B, T, D), load-balancing loss () scalar for this layer).
        """
        b, t, d = x.shape
        flat = x.reshape(b * t, d)  # (N, D)
        probs = self.router(flat).float().softmax(dim=-1)  # (N, E), routing in fp32
        weights, index = probs.topk(self.top_k, dim=-1)  # (N, k) each
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (index == e).nonzero(as_tuple=True)  # tokens routed to expert e
            if rows.numel():
                out.index_add_(0, rows, expert(flat[rows]) * weights[rows, slot, None])
        return out.view(b, t, d), load_balancing_loss(probs, index, self.n_experts)
