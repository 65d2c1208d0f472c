"""Linear layer with a fast path for the few rows of autoregressive decoding on CPU.

Shape legend: R rows (batch × new tokens), I in_features, O out_features, P row blocks.

Decoding one token reads every weight matrix once to multiply it by one vector, so its speed is the
speed at which the matrix-vector product streams the weights from memory. On CPU, `F.linear` sends
a (1, I) input to the BLAS gemv routine, which on our 2-core AMD EPYC (MKL) streams at about 12 GB/s
whatever the thread count (bench/pretrained.py, "matvec_all_weights"). Splitting W into P blocks of
rows, W = [W_1; …; W_P], and computing every W_p x in one batched product (`torch.bmm`, a batch of
P small matrix products) takes another kernel that streams at 25–39 GB/s on 1–2 threads. The
result is the same product; only the order of the fp32 additions differs (≈ 1e-6 relative).

Training and prefill (many rows) and every other device or dtype take `F.linear` unchanged: the
batched path only wins for fp32 on CPU at a few rows (measured: 2.6× at 1 row, 1.1× at 16, slower
at 32; bf16 is slower through it). Other CPUs and BLAS builds may differ: `python bench/pretrained.py`
times both products on yours, and setting `attnlab.nn.linear.MAX_FAST_ROWS = 0` turns the path off.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ROW_BLOCKS = 4      # P: blocks of output rows, one small product each
MAX_FAST_ROWS = 16  # R up to which the batched product beats F.linear (fp32, CPU)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x Wᵀ + b, as `F.linear`, with fp32 CPU inputs of at most MAX_FAST_ROWS rows computed as
    a batched product over ROW_BLOCKS blocks of W's rows (see the module docstring).

    Args:
        x: (..., I). weight: (O, I). bias: (O,) or None.
    Returns:
        (..., O), x's dtype.
    """
    out_features, in_features = weight.shape
    rows = x.numel() // in_features if in_features else 0
    if (rows == 0 or rows > MAX_FAST_ROWS or out_features % ROW_BLOCKS or x.device.type != "cpu"
            or x.dtype != torch.float32 or weight.dtype != torch.float32 or not weight.is_contiguous()):
        return F.linear(x, weight, bias)
    blocks = weight.view(ROW_BLOCKS, out_features // ROW_BLOCKS, in_features)  # (P, O/P, I)
    xt = x.reshape(1, rows, in_features).expand(ROW_BLOCKS, rows, in_features).transpose(1, 2)  # (P, I, R)
    y = torch.bmm(blocks, xt)  # (P, O/P, R)
    y = y.permute(2, 0, 1).reshape(*x.shape[:-1], out_features)  # (..., O)
    return y if bias is None else y + bias


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, names and initialisation) whose forward is `linear` above, so
    that batch-1 decoding on CPU streams the weights at the faster rate."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., in_features) -> (..., out_features)."""
        return linear(x, self.weight, self.bias)
