"""label_smoothed_cross_entropy (nn/cross_entropy.py): ln V for uniform logits, padding counted in
neither term, no smoothing mass on the pad class, plain cross-entropy at ε = 0."""
import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.nn.cross_entropy import label_smoothed_cross_entropy


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.5])
def test_uniform_logits_give_ln_v(eps):
    logits = torch.zeros(6, 11)
    labels = torch.tensor([3, 4, 5, 6, 7, 0])
    loss = label_smoothed_cross_entropy(logits, labels, eps, pad_id=0)
    assert math.isclose(loss.item(), math.log(11), rel_tol=1e-6)


def test_padded_rows_change_nothing():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 9)
    labels = torch.tensor([[3, 4, 5, 2], [6, 7, 2, 0]])
    base = label_smoothed_cross_entropy(logits, labels, 0.1, pad_id=0)
    padded_logits = torch.cat([logits, torch.randn(2, 3, 9)], 1)
    padded_labels = torch.cat([labels, torch.zeros(2, 3, dtype=torch.long)], 1)
    extra_row = torch.cat([padded_logits, torch.randn(1, 7, 9)], 0)
    extra_labels = torch.cat([padded_labels, torch.zeros(1, 7, dtype=torch.long)], 0)
    torch.testing.assert_close(label_smoothed_cross_entropy(extra_row, extra_labels, 0.1, pad_id=0), base)


def test_no_smoothing_mass_on_padding_and_eps_zero_is_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(5, 7)
    labels = torch.tensor([1, 2, 3, 4, 5])
    torch.testing.assert_close(label_smoothed_cross_entropy(logits, labels, 0.0, pad_id=0),
                               F.cross_entropy(logits, labels))
    # the smoothed target puts 0 on pad: raising the pad logit can only raise the loss
    eps = 0.2
    logp = logits.log_softmax(-1)
    expected = (1 - eps) * -logp.gather(1, labels[:, None]).squeeze(1) + eps * -logp[:, 1:].mean(-1)
    torch.testing.assert_close(label_smoothed_cross_entropy(logits, labels, eps, pad_id=0), expected.mean())
