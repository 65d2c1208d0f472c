import math

import torch

from attnlab.nn.positional import sinusoidal_table


def test_sinusoidal_known_values():
    pe = sinusoidal_table(50, 8)
    assert pe.shape == (50, 8)
    pos, i = 7, 1  # dims 2 and 3 use frequency 1 / 10000^(2/8)
    assert math.isclose(pe[pos, 2].item(), math.sin(pos / 10000 ** (2 / 8)), rel_tol=1e-5)
    assert math.isclose(pe[pos, 3].item(), math.cos(pos / 10000 ** (2 / 8)), rel_tol=1e-5)
    assert torch.equal(pe[0, 0::2], torch.zeros(4)) and torch.equal(pe[0, 1::2], torch.ones(4))
