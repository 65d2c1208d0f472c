"""The output projection and the (label-smoothed) cross-entropy of its logits, in chunks of rows,
with the gradient taken in the forward pass: no (N, V) tensor lives past one chunk.

Shape legend: N positions, D model dim, V vocabulary, C rows per chunk.

    loss = mean over the N rows of  (1 − ε)(lse(z) − z_y) + ε (lse(z) − mean(z)),   z = h Wᵀ (N, V)

(with pad_id, mean(z) is over the V − 1 classes other than pad: the smoothing puts no mass on
padding, as nn/cross_entropy.py label_smoothed_cross_entropy, the translation loss of Vaswani et al.
2017, §5.4)

Composed of autograd's ops (the head, log_softmax, nll), a step keeps the (N, V) log-probabilities
for the backward and makes two more (N, V) tensors in it (their gradient, the logits' gradient):
~200 MB for SmolLM2's 49,152 tokens at 350 positions, the largest tensors of a fine-tuning step.
Here each chunk of C rows computes its logits, their log-sum-exp, its loss and its logits' gradient

    ∂loss/∂z = (softmax(z) − (1 − ε) one_hot(y) − ε u) / N,   u = 1 / V (with pad_id: 1 / (V − 1), 0 at pad)

from which the chunk's ∂/∂h = (∂loss/∂z) W (and ∂/∂W += (∂loss/∂z)ᵀ h when W is trained) is
taken at once; the backward only scales the saved (N, D) (and (V, D)) gradients by the incoming
one. The same values as F.cross_entropy(label_smoothing=ε) of head(h) up to fp32 rounding of the
sums (tests/nn/test_linear_cross_entropy.py). Liger-Kernel's fused linear cross-entropy (Hsu et al.
2024, §3.2) does the same on GPUs.

The head is an fp32 nn.Linear without bias (a trained or a frozen weight, tied to an embedding or
not) or a QuantLinear (frozen; its product and its input gradient). Under CPU bf16 autocast an
nn.Linear head takes the chunks too, with the products in autocast's dtype as autocast would run
them: z = round(h) round(W)ᵀ rounded to that dtype, then fp32 for the softmax and the loss (as
autocast's fp32 log_softmax reads the composition's low-precision logits), and the chunk's ∂loss/∂z
rounded to that dtype for its two products (as the gradient reaches autocast's product); ∂/∂W adds
the chunks' rounded products in fp32, where the composition rounds one product of all N rows (the
same loss; gradients as close to fp32's as the composition's). A chunk then also makes, for a moment,
its low-precision (C, V) product and gradient (half the size each). Anything else (fp16 autocast,
whose range would flush the small (p − y) / N to zero; autocast of a QuantLinear head; a bf16 hidden
state, a bias, a sharded weight; no gradient needed) takes the composition:
label_smoothed_cross_entropy of head(h).

A chunk holds about CHUNK_BYTES of logits: 128 rows of SmolLM2's 49,152 tokens, 786 of Multi30k's
8,000. The translation step (fp32, 2 threads, AMD EPYC Zen 3, 2,000-token batches) against the
composition in the same rotation: 712.7 against 878.6 ms, 1.23x (`python bench/train_step.py
--recipes multi30k-en-de --candidates fused fused_composed_loss --steps 3 --rounds 6 --first-step 200
--no-probes`, bench/results/train_step_multi30k_fused_loss_amd_epyc_zen3.json); the composition
spent ~115 ms of its step outside the products (the (N, V) log-softmax forward and backward, the
gather's zero-filled gradient). In alternated steps of a throwaway script, 128-row chunks gave
~1.07x, 512-1,024 rows ~1.10-1.22x. Under bf16 autocast (the recipe's step on CPUs with native bf16
products; AMD EPYC Zen 5, 2 threads) the same command with `--candidates bf16 bf16_composed_loss`:
277.2 against 402.7 ms, 1.45x (another run: 301.6 against 404.2;
bench/results/train_step_multi30k_bf16_fused_loss_zen5.json).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.cross_entropy import label_smoothed_cross_entropy
from attnlab.nn.quant_linear import QuantLinear

CHUNK_BYTES = 128 * 49_152 * 4  # a chunk's (C, V) fp32 logits, the one (C, V) tensor that lives: 24 MiB;
# at SmolLM2's vocabulary 128 rows, whose two products run ~25% faster than 64 rows' (MKL, AMD EPYC
# Zen 4: 492 against 640 ms for SmolLM2's 360 response positions, forward and backward, 2 threads)


def chunk_rows_for(vocab: int) -> int:
    """C: the rows whose (C, V) fp32 logits fill CHUNK_BYTES (at least 1)."""
    return max(1, CHUNK_BYTES // (4 * vocab))


def _fused(head: nn.Module, hidden: torch.Tensor) -> bool:
    """Whether this head and input take the chunked path (module docstring); gradients needed."""
    trained = hidden.requires_grad or (not isinstance(head, QuantLinear) and head.weight.requires_grad)
    if not (torch.is_grad_enabled() and trained) or hidden.dtype != torch.float32 or hidden.dim() != 2:
        return False
    autocast = torch.is_autocast_enabled(hidden.device.type)
    if autocast and (hidden.device.type != "cpu" or torch.get_autocast_dtype("cpu") != torch.bfloat16):
        return False  # fp16 would round (p − y) / N into its subnormals
    if isinstance(head, QuantLinear):
        return head.bias is None and not autocast
    return (isinstance(head, nn.Linear) and head.bias is None and type(head.weight.data) is torch.Tensor
            and head.weight.dtype == torch.float32)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    @torch.autocast("cpu", enabled=False)  # the products' dtype is `low`, chosen by the caller
    def forward(ctx, hidden, weight, targets, head, epsilon, chunk, pad_id, low):
        n, vocab = hidden.size(0), head.out_features
        spread = vocab if pad_id is None else vocab - 1  # the classes the smoothing covers
        quant = isinstance(head, QuantLinear)
        grad_h = torch.empty_like(hidden)
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        total = hidden.new_zeros(())
        w = weight if low is None else weight.to(low)  # autocast's cast of the weight, once
        for s in range(0, n, chunk):
            h, y = hidden[s:s + chunk], targets[s:s + chunk, None]
            if low is not None:
                h = h.to(low)
            z = head.product(h) if quant else (h @ w.t()).float()  # (C, V) fp32
            picked, mean = z.gather(1, y)[:, 0], None
            if epsilon:
                mean = z.sum(dim=-1) if pad_id is None else z.sum(dim=-1) - z[:, pad_id]
                mean /= spread
            top = z.amax(dim=-1, keepdim=True)  # (C, 1)
            g = z.sub_(top).exp_()  # exp(z − max), in the logits' place (no second (C, V) tensor)
            norm = g.sum(dim=-1, keepdim=True)
            lse = norm.log().add_(top)  # (C, 1): torch.logsumexp's own formula
            rows = lse[:, 0] - picked
            if epsilon:
                rows = (1 - epsilon) * rows + epsilon * (lse[:, 0] - mean)
            total += rows.sum()
            g.div_(norm)  # softmax
            if epsilon:
                g.sub_(epsilon / spread)
                if pad_id is not None:
                    g[:, pad_id] += epsilon / spread
            g.scatter_add_(1, y, g.new_full(y.shape, -(1 - epsilon)))
            g.div_(n)
            if low is not None:
                g = g.to(low)
            grad_h[s:s + chunk] = head.input_grad(g) if quant else g @ w
            if grad_w is not None:
                if low is None:
                    grad_w.addmm_(g.t(), h)
                else:
                    grad_w += g.t() @ h
            del z, g  # freed before the next chunk's logits are formed: one (C, V) tensor lives, not two
        ctx.save_for_backward(grad_h, *(() if grad_w is None else (grad_w,)))
        return total / n

    @staticmethod
    def backward(ctx, grad):
        grad_h, *grad_w = ctx.saved_tensors
        return grad_h * grad, (grad_w[0] * grad if grad_w else None), None, None, None, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, head: nn.Module, targets: torch.Tensor,
                         label_smoothing: float = 0.0, chunk_rows: int | None = None,
                         pad_id: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of head(hidden) against targets (module docstring), differentiable in
    hidden and in the head's weight where it is trained.

    Args:
        hidden: (N, D) the final hidden states of the positions that carry a loss. head: the output
            projection, D -> V. targets: (N,) int64 in [0, V), every row counted (pass only the
            positions that carry a loss). label_smoothing: ε in [0, 1).
        chunk_rows: C, rows per chunk; None: chunk_rows_for(V).
        pad_id: the padding class the smoothing leaves out (None: it covers all V classes).
    Returns:
        () fp32, as label_smoothed_cross_entropy(head(hidden), targets, ε, pad_id=pad_id) (with
        pad_id None, F.cross_entropy(head(hidden).float(), targets, label_smoothing=ε)).
    """
    if not hidden.size(0) or not _fused(head, hidden):
        if pad_id is None:
            return F.cross_entropy(head(hidden).float(), targets, label_smoothing=label_smoothing)
        return label_smoothed_cross_entropy(head(hidden), targets, label_smoothing, pad_id=pad_id)
    weight = head.qs if isinstance(head, QuantLinear) else head.weight  # a quantized head is frozen
    if isinstance(head, QuantLinear) or not weight.requires_grad:
        weight = weight.detach()
    chunk = chunk_rows_for(head.out_features) if chunk_rows is None else chunk_rows
    cpu_autocast = hidden.device.type == "cpu" and torch.is_autocast_enabled("cpu")
    low = torch.get_autocast_dtype("cpu") if cpu_autocast else None
    return _LinearCrossEntropy.apply(hidden, weight, targets, head, float(label_smoothing), chunk, pad_id, low)
