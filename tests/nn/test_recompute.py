"""Selective recomputation (nn/recompute.py): a GPT trained with it gives bit for bit the loss and
gradients of keeping every activation, and a LoRA layer keeps no (R, D) norm output and no
(R, F) SwiGLU product for its backward."""
from __future__ import annotations

import pytest
import torch

from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn import recompute
from attnlab.nn.lora import TARGETS, apply_lora, lora_layers
from attnlab.nn.mlp import gated_silu
from attnlab.nn.norm import RMSNorm

D, F_, R = 64, 96, 24


def tiny_llama(lora: bool) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig.from_name("llama", vocab_size=64, d_model=D, n_layers=2, n_heads=4, n_kv_heads=2,
                              d_ff=F_, max_seq_len=32)
    model = GPT(cfg).train()
    if lora:
        apply_lora(model, TARGETS, rank=4, alpha=8)
        with torch.no_grad():
            for layer in lora_layers(model).values():
                layer.lora_B.weight.normal_(0, 0.1)
    return model


def loss_and_grads(model: GPT, ids: torch.Tensor):
    model.zero_grad(set_to_none=True)
    logits = model(ids[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


class Kept:
    """Counts the bytes of the distinct storages autograd keeps under saving_marked (what _pack
    leaves as tensors), or of everything saved when `everything`."""

    def __init__(self, monkeypatch, everything: bool = False):
        self.storages: dict[int, int] = {}
        pack = recompute._pack

        def counting(t):
            packed = t if everything else pack(t)
            if isinstance(packed, torch.Tensor):
                self.storages[packed.untyped_storage().data_ptr()] = packed.untyped_storage().nbytes()
            return packed

        monkeypatch.setattr(recompute, "_pack", counting)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())


@pytest.mark.parametrize("lora", [True, False])
def test_recomputation_gives_the_same_loss_and_gradients_bit_for_bit(lora, monkeypatch):
    ids = torch.randint(0, 64, (3, 17), generator=torch.Generator().manual_seed(1))
    model = tiny_llama(lora)
    loss, grads = loss_and_grads(model, ids)
    with monkeypatch.context() as m:
        m.setattr(recompute, "_pack", lambda t: t)  # keep every activation (autograd's default)
        kept_loss, kept_grads = loss_and_grads(model, ids)
    assert torch.equal(loss, kept_loss) and grads.keys() == kept_grads.keys() and len(grads) > 0
    for name, g in grads.items():
        assert torch.equal(g, kept_grads[name]), name


def test_a_lora_layer_keeps_neither_norm_outputs_nor_the_swiglu_product(monkeypatch):
    model = tiny_llama(lora=True)
    layer, rope = model.layers[0], model.rotary(torch.arange(R), torch.float32)
    x = torch.randn(1, R, D, requires_grad=True)
    with monkeypatch.context() as m:
        everything = Kept(m, everything=True)
        with recompute.saving_marked():
            layer(x, rope=rope, is_causal=True)
    kept = Kept(monkeypatch)
    with recompute.saving_marked():
        out = layer(x, rope=rope, is_causal=True)
    adapters = sum(p.numel() * 4 for p in layer.parameters() if p.requires_grad)
    row = 4 * R  # bytes per feature over the R rows (fp32)
    # x and the residual after attention (the norms' inputs), q, k, v (K = 2 heads of 16), the
    # attention output (the o_proj input, the same storage), gate and up; x·Aᵀ of the 7 adapters,
    # the norms' 1 / rms and the attention's log-sum-exp (4 heads) per row; the adapters, the norm
    # gains and RoPE's cos and sin
    bound = row * (D + D + D + 2 * 32 + D + 2 * F_ + 7 * 4 + 2 + 4) + adapters + 2 * 4 * D + 2 * 4 * R * 16
    assert kept.bytes <= bound
    assert everything.bytes - kept.bytes >= row * (2 * D + F_)  # the norms' outputs and SiLU(g) ⊙ u
    out.hidden.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_marks_only_with_gradients_and_without_autocast():
    norm = RMSNorm(8).requires_grad_(False)
    x = torch.randn(2, 8)
    assert not hasattr(norm(x), recompute._ATTR)  # no graph: nothing to recompute for
    x.requires_grad_(True)
    y = norm(x)
    assert hasattr(y, recompute._ATTR) and torch.equal(getattr(y, recompute._ATTR).get(), y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not hasattr(norm(x), recompute._ATTR)
    g, u = torch.randn(2, 8, requires_grad=True), torch.randn(2, 8)
    h = gated_silu(g, u)
    assert torch.equal(getattr(h, recompute._ATTR).get(), h)
