"""Sparse mixture-of-experts FFN: a router picks top_k of E expert FFNs per token.

Shape legend: B batch, T length, D model dim, F expert hidden dim, E experts, N = B·T tokens,
k experts per token (top_k).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.errors import UserError
from attnlab.nn.mlp import make_ffn


def load_balancing_loss(router_probs: torch.Tensor, expert_index: torch.Tensor, n_experts: int,
                        token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The Switch Transformer auxiliary loss E · Σ_i f_i · P_i over the real tokens.

    With M the real tokens (those where token_mask is True; all N without a mask):
    f_i = (1/|M|) Σ_{t ∈ M} Σ_{j=1..k} [expert_index[t, j] = i], the mean number of a token's k choices
    that go to expert i (Σ_i f_i = k), and P_i = (1/|M|) Σ_{t ∈ M} router_probs[t, i], the mean router
    probability of expert i (Σ_i P_i = 1). Under perfectly uniform routing (f_i = k/E, P_i = 1/E) the
    loss equals k = top_k (as Hugging Face's Mixtral); it grows as the router favours a few experts,
    up to E when every token puts all its probability on one expert that it picks. Padding never
    counts: neither its choices nor its probabilities enter f or P, so a padded batch gives the loss
    of its real tokens alone. Only P carries a gradient.

    Args:
        router_probs: (N, E) softmax of the router logits. expert_index: (N, k) int64 chosen experts.
        n_experts: E. token_mask: (N,) bool, True = a real token; None = every token is real.
    Returns:
        () float32 scalar; 0 when no token is real.
    Raises:
        ValueError: when token_mask is not (N,).
    Source: Fedus et al. 2021, "Switch Transformers", §2.2, equations (4)–(6); with top_k > 1 and an
        attention mask as Hugging Face's Mixtral load_balancing_loss_func (f summed over the k
        choices, padding left out: huggingface/transformers#28517).
    """
    chosen = F.one_hot(expert_index, n_experts).float().sum(dim=1)  # (N, E): each token's choices per expert
    probs = router_probs.float()  # (N, E)
    if token_mask is not None:
        n = router_probs.size(0)
        if token_mask.shape != (n,):
            raise UserError(f"token_mask must have shape ({n},) (one flag per token), got {tuple(token_mask.shape)}")
        real = token_mask.bool()
        chosen, probs = chosen[real], probs[real]  # (|M|, E) each: the real tokens only
        if not bool(real.any()):
            return probs.sum() * 0.0  # no real token: no statistic, a zero that keeps the graph
    fraction = chosen.mean(dim=0)  # (E,) f_i
    mean_prob = probs.mean(dim=0)  # (E,) P_i
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
            raise UserError(f"moe_top_k must be in 1..n_experts={n_experts}, got {top_k}")
        self.n_experts, self.top_k = n_experts, top_k
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(make_ffn(d_model, d_ff, activation, dropout, bias) for _ in range(n_experts))

    def forward(self, x: torch.Tensor, token_mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Args:
            x: (B, T, D).
            token_mask: (B, T) bool, True = a real token, False = padding; None = all real. Padding
                positions are still computed (their output is unused) but left out of the
                load-balancing loss.
        Returns:
            (y (B, T, D) in x's dtype, load-balancing loss () float32 scalar for this layer over
            the real tokens; see load_balancing_loss).
        Raises:
            ValueError: when token_mask is not (B, T).
        """
        b, t, d = x.shape
        if token_mask is not None and token_mask.shape != (b, t):
            raise UserError(f"token_mask must have shape ({b}, {t}) like x's tokens, got {tuple(token_mask.shape)}")
        flat = x.reshape(b * t, d)  # (N, D)
        probs = self.router(flat).float().softmax(dim=-1)  # (N, E), routing in fp32
        weights, index = probs.topk(self.top_k, dim=-1)  # (N, k) each
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (index == e).nonzero(as_tuple=True)  # tokens routed to expert e
            if rows.numel():
                out.index_add_(0, rows, expert(flat[rows]) * weights[rows, slot, None])
        real = None if token_mask is None else token_mask.reshape(b * t).bool()  # (N,)
        return out.view(b, t, d), load_balancing_loss(probs, index, self.n_experts, real)
