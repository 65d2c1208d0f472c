"""LoRA (nn/lora.py): B = 0 is the base exactly, merging is exact, only the adapters train (gradients,
optimizer state, state dict), and a quantized base keeps running its quantized kernels."""
from __future__ import annotations

import pytest
import torch

from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn import quant_linear
from attnlab.nn.lora import TARGETS, LoRALinear, apply_lora, lora_layers, merge_lora, trainable_parameters
from attnlab.nn.quant import dequantize
from attnlab.nn.quant_linear import QuantLinear, quantize_model
from attnlab.train.optim import build_optimizer


def tiny_llama(**overrides) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig.from_name("llama", **{**dict(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                                 max_seq_len=32), **overrides})
    return GPT(cfg).eval()


def trained_adapters(model: GPT, std: float = 0.1) -> GPT:
    """Give every adapter a non-zero B, as training would."""
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.weight.normal_(0, std)
    return model


IDS = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("scheme", [None, "q8_0", "q4_1"])
def test_zero_b_is_the_base_exactly(scheme):
    model = tiny_llama()
    if scheme:
        quantize_model(model, scheme)
    base = model(IDS).logits
    names = apply_lora(model, TARGETS, rank=4, alpha=8)
    assert len(names) == 2 * 7
    assert all(float(layer.lora_B.weight.detach().abs().sum()) == 0 for layer in lora_layers(model).values())
    assert torch.equal(model(IDS).logits, base)


def test_merge_folds_the_update_exactly():
    model = trained_adapters(tiny_llama())
    apply_lora(model, TARGETS, rank=4, alpha=8)
    trained_adapters(model)
    unmerged = model(IDS).logits
    merge_lora(model)
    assert not lora_layers(model)
    merged = model(IDS).logits
    assert (merged - unmerged).abs().max() <= 1e-5 * unmerged.abs().max()
    assert "layers.0.self_attn.q_proj.weight" in model.state_dict()  # the plain model's state dict again


def test_merge_of_a_quantized_base_is_its_dequantized_weight_plus_the_update():
    model = tiny_llama()
    quantize_model(model, "q8_0")
    apply_lora(model, ["q_proj"], rank=2, alpha=4)
    trained_adapters(model)
    layer = model.layers[0].self_attn.q_proj
    expected = dequantize(layer.base_layer.qweight) + layer.scaling * layer.lora_B.weight @ layer.lora_A.weight
    assert torch.allclose(layer.merged().weight, expected, atol=1e-6)


def test_only_the_adapters_train():
    model = tiny_llama()
    apply_lora(model, ["q_proj", "v_proj", "down_proj"], rank=4, alpha=8)
    adapters = {n for n, p in model.named_parameters() if ".lora_" in n}
    assert {n for n, p in model.named_parameters() if p.requires_grad} == adapters
    assert trainable_parameters(model) == sum(p.numel() for n, p in model.named_parameters() if n in adapters)
    optimizer = build_optimizer(model, 1e-2, (0.9, 0.999), 1e-8, weight_decay=0.1)
    model.train()
    model(IDS).logits.logsumexp(-1).mean().backward()
    optimizer.step()
    assert {n for n, p in model.named_parameters() if p.grad is not None} == adapters
    by_id = {id(p): n for n, p in model.named_parameters()}
    assert {by_id[id(p)] for p in optimizer.state} == adapters
    # the state dict (checkpoints, best weights) is the adapters alone, and loads back strictly
    state = model.state_dict()
    assert set(state) == adapters
    fresh = tiny_llama()
    apply_lora(fresh, ["q_proj", "v_proj", "down_proj"], rank=4, alpha=8)
    fresh.load_state_dict(state)
    assert torch.equal(fresh(IDS).logits, model.eval()(IDS).logits)


def test_scaling_rslora_and_dropout():
    base = torch.nn.Linear(32, 16)
    assert LoRALinear(base, 4, 8).scaling == 2.0
    assert LoRALinear(torch.nn.Linear(32, 16), 4, 8, use_rslora=True).scaling == 4.0
    layer = LoRALinear(torch.nn.Linear(32, 16), 4, 8, dropout=0.5)
    torch.nn.init.normal_(layer.lora_B.weight)
    x = torch.randn(3, 32)
    layer.eval()
    assert torch.allclose(layer(x), layer.base_layer(x) + 2.0 * x @ layer.lora_A.weight.T @ layer.lora_B.weight.T,
                          atol=1e-5)
    layer.train()  # dropout on the update's input only: the base still sees x
    torch.manual_seed(3)
    y = layer(x)
    torch.manual_seed(3)
    assert torch.allclose(y, layer.base_layer(x) + layer.update(x), atol=1e-6)


@pytest.mark.parametrize("targets, match", [(["qkv"], "must be a non-empty list"), ([], "non-empty"),
                                            (["gate_proj"], "match no linear layer")])
def test_bad_targets_are_named(targets, match):
    model = tiny_llama(activation="gelu", d_ff=128) if targets == ["gate_proj"] else tiny_llama()
    with pytest.raises(ValueError, match=match):
        apply_lora(model, targets, rank=4, alpha=8)


def test_a_second_apply_is_refused():
    model = tiny_llama()
    apply_lora(model, ["q_proj"], rank=4, alpha=8)
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        apply_lora(model, ["v_proj"], rank=4, alpha=8)


def test_quantized_base_runs_its_kernels_and_passes_gradients(monkeypatch):
    model = tiny_llama()
    reference = tiny_llama()  # the same weights, dequantized: the gradient's reference
    quantize_model(model, "q8_0")
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, QuantLinear):
                reference.get_submodule(name).weight.copy_(dequantize(module.qweight))
    for m in (model, reference):
        apply_lora(m, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj"], rank=4, alpha=8)
    reference.load_state_dict(trained_adapters(model).state_dict())
    calls = {"product": 0}
    product = QuantLinear.product

    def counted(self, x):
        calls["product"] += 1
        return product(self, x)

    monkeypatch.setattr(QuantLinear, "product", counted)
    assert not [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]  # no fp32 copy of a base weight
    model.train(), reference.train()
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(2))  # 64 rows: the bf16 GEMM route
    for m in (model, reference):
        m(ids).logits.float().logsumexp(-1).mean().backward()
    per_forward = 2 * 7 + 1  # per layer: q, k, v, out_proj, gate, up, down; then lm_head
    assert calls["product"] == per_forward
    ref = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        q = ref[name]
        if p.requires_grad:  # the gradient reached every adapter through the quantized layers above it
            assert p.grad is not None and p.grad.abs().max() > 0, name
            assert torch.allclose(p.grad, q.grad, rtol=0.05, atol=0.05 * float(q.grad.abs().max())), name


def test_quantized_layer_input_gradient_is_the_dequantized_product():
    torch.manual_seed(0)
    layer = quant_linear.set_quantized(torch.nn.Sequential(torch.nn.Linear(64, 48)), "0",
                                       quant_linear.quantize(torch.randn(48, 64), "q4_1"))
    for rows in (3, 40):  # the int8 decode route and the bf16 GEMM route
        x = torch.randn(rows, 64, requires_grad=True)
        g = torch.randn(rows, 48)
        layer(x).backward(g)
        expected = g @ dequantize(layer.qweight)
        assert torch.allclose(x.grad, expected, rtol=0.02, atol=0.02 * float(expected.abs().max()))
