"""Block quantization (nn/quant.py) against gguf-py bit for bit, and the quantized linear layer
(nn/quant_linear.py, nn/quant_kernel.py) against the dequantized fp32 product within the bound its
activation rounding implies; quantized generation cached == uncached; clean refusals.

The bound. The kernel computes F.linear(x̂, Ŵ) exactly up to fp32 summation order, where Ŵ is the
dequantized weight and x̂ is x rounded to its block's int8 grid: x̂_i = q_i · dx_b with
dx_b = max_{i∈b} |x_i| / 127 and |x_i − x̂_i| ≤ dx_b / 2 (round to nearest). Hence, per output o,
    |y_o − Σ_i Ŵ_oi x_i| ≤ Σ_b (dx_b / 2) Σ_{i∈b} |Ŵ_oi|   (+ fp32 rounding, ≤ 1e-5 · Σ_i |Ŵ_oi x_i|).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab.generate import generate
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.interop.gguf_quants import GGML_TYPE, from_gguf_blocks, to_gguf_blocks
from attnlab.nn import cpu_tuning
from attnlab.nn.quant import SCHEMES, dequantize, quantize, quantize_activations
from attnlab.nn.quant_kernel import PREFILL_ROWS, kernel, quant_matmul
from attnlab.nn.quant_linear import QuantEmbedding, QuantLinear, check_dtype, quantize_model, set_dtype

IMPLS = ["torch"] + (["cpp"] if kernel() == "cpp" else [])


def _weights(rows=48, cols=128, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 0.3
    w[0, :32] = 0.0                          # an all-zero block (d = 0)
    w[1, :32] = torch.arange(32) / 2 - 8.0   # exact .5 ties
    w[2, 32:64] = 7.0                         # a constant block
    w[3, :32] = -w[3, :32].abs()              # all negative
    return w


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantize_and_dequantize_equal_gguf_bit_for_bit(scheme):
    gguf = pytest.importorskip("gguf", reason="needs the gguf package (pip install 'attnlab[hf]')")
    w = _weights()
    qtype = gguf.GGMLQuantizationType(GGML_TYPE[scheme])
    theirs = gguf.quants.quantize(w.numpy(), qtype)  # (O, NB · bytes per block) uint8
    qw = quantize(w, scheme)
    assert np.array_equal(to_gguf_blocks(qw).numpy(), theirs)
    assert np.array_equal(dequantize(qw).numpy(), gguf.quants.dequantize(theirs, qtype))
    back = from_gguf_blocks(theirs, scheme, tuple(w.shape))
    assert all(torch.equal(a, b) for a, b in zip((back.qs, back.d), (qw.qs, qw.d)))
    assert (back.m is None) == (scheme != "q4_1") and (back.m is None or torch.equal(back.m, qw.m))


def test_block_layouts_by_hand():
    w = torch.zeros(1, 32)
    w[0, 0], w[0, 16], w[0, 31] = 1.0, -2.0, 0.5
    q8 = quantize(w, "q8_0")
    assert q8.d.item() == np.float16(2.0 / 127) and q8.qs[0, 16].item() == -127 and q8.qs[0, 0].item() == 64
    q4 = quantize(w, "q4_0")  # x_max = −2 (largest magnitude): d = 0.25, q = trunc(x / d + 8.5)
    assert q4.d.item() == 0.25 and q4.qs[0, 0].item() == 0x0 << 4 | 12  # element 0 low, element 16 high
    assert dequantize(q4)[0, 16].item() == -2.0 and dequantize(q4)[0, 31].item() == 0.5


def test_activation_quantization_error_is_half_a_step():
    x = torch.randn(5, 96) * torch.tensor([100.0, 1.0, 0.01]).repeat_interleave(32)
    q, d = quantize_activations(x)
    xd = (q.reshape(5, 3, 32).float() * d[..., None]).reshape(5, 96)
    assert bool(((x - xd).abs() <= d.repeat_interleave(32, 1) / 2 * (1 + 1e-6)).all())
    assert q.abs().max() <= 127


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("rows", [1, 3, 7])
def test_quant_linear_within_the_rounding_bound(scheme, impl, rows):
    w = _weights(rows=37, cols=192)  # 37: not a multiple of the kernel's 4-row tile (rows < PREFILL_ROWS)
    qw = quantize(w, scheme)
    wd = dequantize(qw)
    x = torch.randn(rows, 192) * torch.linspace(0.1, 20, 192)
    y = quant_matmul(x, qw, impl)
    exact = F.linear(x.double(), wd.double())
    _, dx = quantize_activations(x)
    bound = (dx / 2).double() @ wd.abs().double().reshape(37, 6, 32).sum(-1).T  # (R, O)
    slack = 1e-5 * (x.abs().double() @ wd.abs().double().T)
    assert bool(((y.double() - exact).abs() <= bound + slack).all())
    assert float((y - exact).abs().max()) > 0  # activations are really quantized


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("prefill", ["bf16", "fp32"])
def test_many_rows_take_the_machines_prefill_product(scheme, impl, prefill, monkeypatch):
    """bf16 where the CPU multiplies bf16 natively, fp32 elsewhere (cpu_tuning.prefill_dtype)."""
    monkeypatch.setattr(cpu_tuning, "prefill_dtype", lambda info=None: prefill)
    qw = quantize(_weights(rows=40, cols=128), scheme)
    x = torch.randn(PREFILL_ROWS, 128)
    if prefill == "bf16":
        expected, same = F.linear(x.bfloat16(), dequantize(qw).bfloat16()).float(), torch.equal
    else:  # the same product up to fp32 summation order (BLAS may block the two calls differently)
        expected = F.linear(x, dequantize(qw))
        same = lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-5)  # noqa: E731
    assert same(quant_matmul(x, qw, impl), expected)
    layer = QuantLinear(qw)
    assert same(layer(x[None]), expected[None])
    assert torch.allclose(layer(x[:5]), quant_matmul(x[:5], qw, impl), rtol=1e-5, atol=1e-4)  # int8 below


@pytest.mark.skipif("cpp" not in IMPLS, reason="the C++ kernel is not available here")
@pytest.mark.parametrize("scheme", SCHEMES)
def test_cpp_kernel_equals_the_pytorch_reference(scheme):
    qw = quantize(_weights(rows=50, cols=256), scheme)
    x = torch.randn(9, 256)
    a, b = quant_matmul(x, qw, "cpp"), quant_matmul(x, qw, "torch")
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


@pytest.mark.skipif("cpp" not in IMPLS, reason="the C++ kernel is not available here")
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("out", [16, 37, 64])  # 4-row tiles only; 4-row then 1-row ones
def test_cpp_kernel_rows_of_a_batch_get_their_bits_alone(scheme, out):
    """The rows layout's tiles sum each output in one order whatever the number of activation rows
    (1..PREFILL_ROWS - 1, several tile widths): a row's result is the same bits in a batch as alone,
    and within the rounding bound of the dequantized reference (the tiled layout: test_quant_tiles.py)."""
    qw = quantize(_weights(rows=out, cols=320, seed=3), scheme)  # NB = 10: not a multiple of 4 or 16
    x = torch.randn(PREFILL_ROWS - 1, 320) * torch.linspace(0.1, 20, 320)
    batched = quant_matmul(x, qw, "cpp")
    for rows in (1, 5, 8, 11):
        assert torch.equal(quant_matmul(x[:rows], qw, "cpp"), batched[:rows])
    for r in range(x.shape[0]):
        assert torch.equal(quant_matmul(x[r:r + 1], qw, "cpp")[0], batched[r])
    ref = quant_matmul(x, qw, "torch")
    assert torch.allclose(batched, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


def tiny_llama(tied=True) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig.from_name("llama", vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128,
                              max_seq_len=64, tie_embeddings=tied)
    return GPT(cfg).eval()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantized_generation_cached_equals_uncached(scheme):
    model = quantize_model(tiny_llama(), scheme)
    assert isinstance(model.lm_head, QuantLinear) and isinstance(model.embed_tokens, QuantEmbedding)
    assert model.lm_head.qs is model.embed_tokens.qs  # tied: quantized once, shared
    assert not any(p.dim() == 2 for p in model.parameters())  # no float matrix left
    prompts = [[1, 5, 9, 2], [7, 3]]
    cached = generate(model, prompts, 12, stop_tokens=[])
    assert cached == generate(model, prompts, 12, stop_tokens=[], use_cache=False)


def test_quantized_embedding_is_the_dequantized_rows():
    model = tiny_llama(tied=False)
    table = model.embed_tokens.weight.detach().clone()
    quantize_model(model, "q4_1")
    ids = torch.tensor([[3, 0, 95]])
    assert torch.equal(model.embed_tokens(ids)[0], dequantize(quantize(table, "q4_1"))[[3, 0, 95]])


def test_set_dtype_bf16_and_fp32():
    model = set_dtype(tiny_llama(), "bf16")
    assert model.lm_head.weight.dtype == torch.bfloat16
    assert len(generate(model, [[1, 2, 3]], 4, stop_tokens=[])[0]) == 4
    ref = tiny_llama()
    assert set_dtype(ref, "fp32") is ref and ref.lm_head.weight.dtype == torch.float32


def test_unsupported_quantizations_are_refused_by_name():
    for bad in ("q5_k", "int4", "Q8_0"):
        with pytest.raises(ValueError, match=f"'{bad}' is not supported; supported: auto, fp32, bf16, q8_0"):
            check_dtype(bad)
    with pytest.raises(ValueError, match="'q6_k' is not supported"):
        quantize(torch.zeros(2, 32), "q6_k")
    model = GPT(GPTConfig.from_name("llama", vocab_size=50, d_model=48, n_layers=1, n_heads=4, max_seq_len=8))
    with pytest.raises(ValueError, match=r"multiple of 32; .* has shape \(\d+, 48\)"):
        quantize_model(model, "q8_0")
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize(torch.zeros(3, 40), "q4_0")


def test_quant_linear_takes_zero_rows():
    """Regression: an input of no rows (a fine-tune's prefix pass, which keeps no logits) gave a
    reshape error in the C++ route instead of an empty (0, O) output."""
    layer = QuantLinear(quantize(torch.randn(48, 64), "q8_0"))
    assert layer(torch.randn(0, 64)).shape == (0, 48) and layer(torch.randn(2, 0, 64)).shape == (2, 0, 48)
