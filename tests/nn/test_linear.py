"""The decoding fast path of nn/linear.py computes F.linear's product in each of its forms, and only
where it is meant to; the form is the machine's (nn/cpu_tuning.py)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn import cpu_tuning
from attnlab.nn import linear as linear_mod
from attnlab.nn.linear import MAX_FAST_ROWS, Linear, linear
from attnlab.nn.quant_kernel import kernel

FORMS = ["bmm", "blas"] + (["cpp"] if kernel() == "cpp" else [])


@pytest.fixture
def spies(monkeypatch):
    """Calls seen by torch.bmm and the C++ op: {"bmm": [shapes], "cpp": [shapes]}."""
    seen = {"bmm": [], "cpp": []}
    real_bmm = torch.bmm

    def bmm(*args):
        seen["bmm"].append(args[0].shape)
        return real_bmm(*args)

    monkeypatch.setattr(linear_mod.torch, "bmm", bmm)
    real_cpp = linear_mod._cpp
    monkeypatch.setattr(linear_mod, "_cpp", lambda x, w: seen["cpp"].append(tuple(w.shape)) or real_cpp(x, w))
    return seen


def use(monkeypatch, form: str) -> None:
    grad = cpu_tuning.linear_form(False) if form == "cpp" else form  # the C++ op has no backward
    monkeypatch.setattr(linear_mod, "_form", {"name": form, "grad": grad})


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", [(1, 24), (1, 1, 24), (3, 1, 24), (2, 5, 24), (16, 24)])
@pytest.mark.parametrize("bias", [False, True])
def test_fast_forms_equal_f_linear(form, shape, bias, monkeypatch, spies):
    use(monkeypatch, form)
    g = torch.Generator().manual_seed(0)
    layer = Linear(24, 40, bias=bias)
    x = torch.randn(shape, generator=g)
    with torch.no_grad():
        y = layer(x)
    assert spies["bmm"] == ([(4, 10, 24)] if form == "bmm" else [])  # P = 4 blocks of 10 rows of W
    assert spies["cpp"] == ([(40, 24)] if form == "cpp" else [])
    assert y.shape == (*shape[:-1], 40)
    torch.testing.assert_close(y, F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", ["many rows", "bf16", "non-contiguous weight", "odd out_features"])
def test_other_inputs_take_f_linear_exactly(form, case, monkeypatch, spies):
    use(monkeypatch, form)
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(1, 24, generator=g), torch.randn(40, 24, generator=g)
    if case == "many rows":
        x = torch.randn(MAX_FAST_ROWS + 1, 24, generator=g)
    elif case == "bf16":
        x, w = x.bfloat16(), w.bfloat16()
    elif case == "odd out_features":
        if form == "cpp":
            pytest.skip("the C++ form takes any out_features")
        w = w[:39]
    else:
        w = torch.randn(24, 40, generator=g).t()
    assert torch.equal(linear(x, w), F.linear(x, w))
    assert spies["bmm"] == [] and spies["cpp"] == []


def test_linear_is_an_nn_linear_with_the_same_parameters():
    torch.manual_seed(0)
    ours = Linear(8, 12)
    torch.manual_seed(0)
    ref = nn.Linear(8, 12)
    assert isinstance(ours, nn.Linear)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), ref.state_dict().values()))


@pytest.mark.parametrize("form", FORMS)
def test_gradients_flow_through_every_form(form, monkeypatch, spies):
    use(monkeypatch, form)
    layer = Linear(6, 8)
    x = torch.randn(1, 6, requires_grad=True)
    layer(x).sum().backward()
    assert spies["cpp"] == []  # the C++ op has no backward: the machine's other form ran
    ref = nn.Linear(6, 8)
    ref.load_state_dict(layer.state_dict())
    x2 = x.detach().clone().requires_grad_()
    ref(x2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad)


def test_max_fast_rows_zero_turns_the_fast_path_off(monkeypatch, spies):
    monkeypatch.setattr(linear_mod, "MAX_FAST_ROWS", 0)
    x, w = torch.randn(1, 24), torch.randn(40, 24)
    assert torch.equal(linear(x, w), F.linear(x, w))
    assert spies["bmm"] == [] and spies["cpp"] == []


def test_the_form_is_the_machines_rule_and_the_same_at_every_call():
    assert linear_mod.form() == linear_mod.form() == cpu_tuning.linear_form(kernel() == "cpp")
    assert linear_mod.form(grad=True) == cpu_tuning.linear_form(False) != "cpp"


@pytest.mark.skipif(kernel() != "cpp", reason="the C++ kernel is not available here")
@pytest.mark.parametrize("in_features", [24, 100, 576, 1536])  # a masked tail; under and over the one-row form's 768
def test_the_cpp_products_rows_get_the_bits_they_get_alone(in_features):
    """decode_matvec.h's fp32 product takes 1-3 rows in 4 × 3 register tiles and, in the AVX2 build,
    4-8 rows of up to 768 features one weight row at a time: every form adds each output's products
    in the same order, so a row of a batch has the bits it has alone (the batched decoding contract);
    37 output rows: tiles of 4 and a rest of 1."""
    torch.manual_seed(0)
    w, x = torch.randn(37, in_features), torch.randn(16, in_features)
    alone = torch.cat([torch.ops.attnlab_quant.linear_f32(x[r:r + 1], w) for r in range(16)])
    torch.testing.assert_close(alone, x @ w.T, rtol=1e-5, atol=1e-5 * in_features ** 0.5)
    for rows in range(2, 17):
        assert torch.equal(torch.ops.attnlab_quant.linear_f32(x[:rows], w), alone[:rows]), rows
