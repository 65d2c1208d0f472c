"""fp32 islands under CPU autocast (nn/cpu_autocast.py): inside, products run in fp32 and the yielded
cast lifts bf16 inputs; without CPU autocast the block changes nothing."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.nn.cpu_autocast import fp32_under_cpu_autocast


def test_inside_the_island_products_are_fp32_and_bf16_inputs_are_lifted():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 8, generator=g), torch.randn(3, 8, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert F.linear(x, w).dtype == torch.bfloat16  # autocast outside the island
        with fp32_under_cpu_autocast(x) as cast:
            y = F.linear(cast(x), w)
            lifted = cast(x.bfloat16())
        assert F.linear(x, w).dtype == torch.bfloat16  # and again after it
    assert y.dtype == torch.float32 and torch.equal(y, F.linear(x, w))
    assert lifted.dtype == torch.float32


def test_without_cpu_autocast_the_block_changes_nothing():
    x = torch.randn(2, 3).bfloat16()
    with fp32_under_cpu_autocast(x) as cast:
        assert cast(x) is x and not torch.is_autocast_enabled("cpu")
