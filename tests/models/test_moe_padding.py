"""Issue 12 item 2, end to end: a Mixtral-style GPT's load-balancing loss counts real tokens only.

This needs GPT.forward to pass the padding of its new tokens (attention_mask[:, -T:]) to each
layer's mixture of experts (DecoderOnlyLayer.forward → MixtureOfExperts.forward(h, token_mask));
until that wiring exists in models/gpt.py and nn/blocks.py, the padded cases fail.
"""
import pytest
import torch

from attnlab.models.gpt import GPT, GPTConfig
from tests.conftest import spread_weights

TOKENS = [5, 9, 14]
PAD = 0


def mixtral(top_k: int) -> GPT:
    """A tiny Mixtral (RoPE, 4 experts) with larger-than-init matrices, so routing is skewed and
    padding, when counted, moves the loss by a lot (by 0.06 to 0.8 in the issue)."""
    torch.manual_seed(0)
    cfg = GPTConfig.from_name("mixtral", vocab_size=50, d_model=32, n_heads=4, n_layers=2, max_seq_len=32, d_ff=48,
                              n_experts=4, moe_top_k=top_k)
    return spread_weights(GPT(cfg).eval())


@pytest.mark.parametrize("top_k", [1, 2])
def test_aux_loss_is_the_same_with_left_pads_right_pads_and_none(top_k):
    model = mixtral(top_k)
    with torch.no_grad():
        plain = model(torch.tensor([TOKENS])).aux_loss
        left = model(torch.tensor([[PAD, PAD, *TOKENS]]), torch.tensor([[False, False, True, True, True]]),
                     torch.tensor([[0, 0, 0, 1, 2]])).aux_loss
        right = model(torch.tensor([[*TOKENS, PAD, PAD]]), torch.tensor([[True, True, True, False, False]])).aux_loss
    assert plain.item() > top_k + 0.1  # a skewed router: counting the pads would show
    torch.testing.assert_close(left, plain, atol=1e-6, rtol=0)
    torch.testing.assert_close(right, plain, atol=1e-6, rtol=0)


@pytest.mark.parametrize("top_k", [1, 2])
def test_aux_loss_of_a_padded_batch_pools_the_real_tokens_of_its_rows(top_k):
    """Two left-padded rows: the pads of the short row count nowhere, so the loss equals that of the
    two rows' real tokens side by side (here: a batch of two unpadded rows of equal length)."""
    model = mixtral(top_k)
    a, b = [3, 7, 11, 2], [8, 1, 4, 6]
    with torch.no_grad():
        plain = model(torch.tensor([a, b])).aux_loss
        padded = model(torch.tensor([a + [PAD, PAD], [PAD, PAD] + b]),
                       torch.tensor([[True] * 4 + [False] * 2, [False] * 2 + [True] * 4]),
                       torch.tensor([[0, 1, 2, 3, 0, 0], [0, 0, 0, 1, 2, 3]])).aux_loss
    torch.testing.assert_close(padded, plain, atol=1e-6, rtol=0)
