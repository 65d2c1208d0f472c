"""guards.check_finite_weights: one multi-tensor max-norm decides, and the parameter is named."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.train.guards import check_finite_weights


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_nan_or_an_inf_is_named_with_the_step(bad):
    model = _model()
    with torch.no_grad():
        model[2].weight[1, 5] = bad
    with pytest.raises(FloatingPointError, match="the update of step 7 made 2.weight non-finite"):
        check_finite_weights(model, 7)


def test_large_finite_weights_pass_and_frozen_ones_are_not_looked_at():
    model = _model()
    with torch.no_grad():
        model[0].weight.fill_(3e38)  # a sum of these overflows fp32; their maximum does not
        model[1].bias[0] = float("nan")
    model[1].bias.requires_grad_(False)  # frozen (a LoRA base): never updated, never checked
    check_finite_weights(model, 1)


def test_the_verdict_goes_through_agree():
    model = _model()
    seen = []
    check_finite_weights(model, 1, agree=lambda ok: seen.append(ok) or True)
    assert seen == [True]
