"""The decoding fast path of nn/linear.py computes F.linear's product, and only where it is meant to."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn import linear as linear_mod
from attnlab.nn.linear import MAX_FAST_ROWS, Linear, linear


def calls_bmm(monkeypatch) -> list:
    seen = []
    real = torch.bmm

    def spy(*args):
        seen.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(linear_mod.torch, "bmm", spy)
    return seen


@pytest.mark.parametrize("shape", [(1, 24), (1, 1, 24), (3, 1, 24), (2, 5, 24), (16, 24)])
@pytest.mark.parametrize("bias", [False, True])
def test_fast_path_equals_f_linear(shape, bias, monkeypatch):
    g = torch.Generator().manual_seed(0)
    layer = Linear(24, 40, bias=bias)
    x = torch.randn(shape, generator=g)
    seen = calls_bmm(monkeypatch)
    y = layer(x)
    assert seen == [(4, 10, 24)]  # P = 4 blocks of 10 rows of W
    assert y.shape == (*shape[:-1], 40)
    torch.testing.assert_close(y, F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("case", ["many rows", "bf16", "odd out_features", "non-contiguous weight"])
def test_other_inputs_take_f_linear_exactly(case, monkeypatch):
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(1, 24, generator=g), torch.randn(40, 24, generator=g)
    if case == "many rows":
        x = torch.randn(MAX_FAST_ROWS + 1, 24, generator=g)
    elif case == "bf16":
        x, w = x.bfloat16(), w.bfloat16()
    elif case == "odd out_features":
        w = w[:39]
    else:
        w = torch.randn(24, 40, generator=g).t()
    seen = calls_bmm(monkeypatch)
    assert torch.equal(linear(x, w), F.linear(x, w))
    assert seen == []


def test_linear_is_an_nn_linear_with_the_same_parameters():
    torch.manual_seed(0)
    ours = Linear(8, 12)
    torch.manual_seed(0)
    ref = nn.Linear(8, 12)
    assert isinstance(ours, nn.Linear)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), ref.state_dict().values()))


def test_gradients_flow_through_the_fast_path():
    layer = Linear(6, 8)
    x = torch.randn(1, 6, requires_grad=True)
    layer(x).sum().backward()
    ref = nn.Linear(6, 8)
    ref.load_state_dict(layer.state_dict())
    x2 = x.detach().clone().requires_grad_()
    ref(x2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad)


def test_max_fast_rows_zero_turns_the_fast_path_off(monkeypatch):
    monkeypatch.setattr(linear_mod, "MAX_FAST_ROWS", 0)
    seen = calls_bmm(monkeypatch)
    x, w = torch.randn(1, 24), torch.randn(40, 24)
    assert torch.equal(linear(x, w), F.linear(x, w))
    assert seen == []
