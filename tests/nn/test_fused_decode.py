"""The fused C++ decode step (nn/fused_decode.py) against the PyTorch path on the same model.

fp32: logits and caches within 1e-5 of the largest |value| (fp32 summation order: the products and
attention add in another order; measured ≤ 3e-6 over 40 random tiny models).
Quantized: the fused step runs PyTorch's own operations in PyTorch's order everywhere except in
attention (the embedding, RMSNorm's sum, the int8 kernel, RoPE, SiLU through the same Sleef exp), so
one token into an empty cache (attention over one position is exact) gives bit-identical logits, and
the first layer's keys and values are bit-identical at every step. Past one position the attention
output differs in the last bits, and when an activation then lies that close to an int8 rounding
boundary it rounds to the other step (a "flip"): one element moves by one step dx = max|x_b| / 127,
and the logits by up to ~3e-2 of the largest (measured over 120 random tiny models: 5 % of runs
had one, the other steps stayed ≤ 1e-6). So quantized logits are held to QUANT_BOUND, greedy tokens
to equality.
"""
from __future__ import annotations

import pytest
import torch

import attnlab.nn.fused_decode as fused_decode
from attnlab.generate import generate
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn.fused_decode import ENV, FusedDecoder
from attnlab.nn.quant_kernel import kernel
from attnlab.nn.quant_linear import set_dtype
from tests.conftest import spread_weights

pytestmark = pytest.mark.skipif(kernel() != "cpp", reason="the C++ kernel is not available here (nn/quant_kernel.py)")

DTYPES = ("fp32", "q8_0", "q4_0", "q4_1")
BOUND = 1e-5        # of the largest |value|: fp32
QUANT_BOUND = 5e-2  # of the largest |value|: quantized, an int8 rounding flip allowed (module doc)


def tiny(dtype: str = "fp32", preset: str = "llama", **overrides) -> GPT:
    """A random LLaMA-style model with GQA (4 heads, 2 kv heads), weights spread so tokens vary."""
    torch.manual_seed(0)
    sizes = dict(vocab_size=96, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=64)
    if preset != "gpt2":
        sizes["n_kv_heads"] = 2
    model = spread_weights(GPT(GPTConfig.from_name(preset, **{**sizes, **overrides})).eval())
    return set_dtype(model, dtype)


@pytest.fixture
def counted(monkeypatch):
    """The number of fused steps taken so far: calls["n"]."""
    calls = {"n": 0}
    step = FusedDecoder.step

    def counting(self, *args):
        calls["n"] += 1
        return step(self, *args)

    monkeypatch.setattr(FusedDecoder, "step", counting)
    return calls


@torch.no_grad()
def decode(model: GPT, ids: list[int], prefill: int, fused: bool, monkeypatch, chunks=()) -> tuple:
    """Prefill ids[:prefill] (PyTorch path), then feed the rest one token at a time (chunks: steps
    that instead feed two tokens in one PyTorch forward). Returns (stacked logits of the one-token
    steps, the caches' keys and values)."""
    monkeypatch.setenv(ENV, "1" if fused else "0")
    t = torch.tensor([ids])
    model.setup_kv_cache(1, len(ids) + 4)
    if prefill:
        model(t[:, :prefill])
    logits, i = [], prefill
    while i < len(ids):
        n = 2 if i in chunks else 1
        out = model(t[:, i:i + n], position_ids=torch.arange(i, i + n)[None]).logits
        if n == 1:
            logits.append(out[0, -1])
        i += n
    held = model.caches[0].length - model.caches[0].start
    kv = [c.k[:, :, :held].clone() for c in model.caches] + [c.v[:, :, :held].clone() for c in model.caches]
    model.clear_kv_cache()
    return torch.stack(logits), kv


def assert_close(a: torch.Tensor, b: torch.Tensor, dtype: str = "fp32") -> None:
    bound = BOUND if dtype == "fp32" else QUANT_BOUND
    assert (a - b).abs().max() <= bound * b.abs().max(), float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_one_token_into_an_empty_cache_is_pytorchs_bit_for_bit_when_quantized(dtype, tied, monkeypatch, counted):
    model = tiny(dtype, tie_embeddings=tied)
    fused, fused_kv = decode(model, [7, 8], 0, True, monkeypatch)  # prefill of nothing: two fused steps
    assert counted["n"] == 2
    ref, ref_kv = decode(model, [7, 8], 0, False, monkeypatch)
    if dtype == "fp32":
        assert_close(fused, ref)
    else:
        assert torch.equal(fused[0], ref[0])  # attention over one position: every operation the same
        assert torch.equal(fused_kv[0], ref_kv[0]) and torch.equal(fused_kv[2], ref_kv[2])  # layer 0's k, v


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_steps_equal_the_pytorch_path(dtype, tied, monkeypatch, counted):
    model = tiny(dtype, tie_embeddings=tied)
    ids = torch.randint(0, 96, (14,)).tolist()
    fused, fused_kv = decode(model, ids, 5, True, monkeypatch)
    assert counted["n"] == 9
    ref, ref_kv = decode(model, ids, 5, False, monkeypatch)
    assert counted["n"] == 9
    assert_close(fused, ref, dtype)
    for a, b in zip(fused_kv, ref_kv):
        assert_close(a, b, dtype)
    if dtype != "fp32":  # layer 0's keys and values: embedding, RMSNorm, int8 q|k|v, RoPE, all PyTorch's
        assert torch.equal(fused_kv[0], ref_kv[0]) and torch.equal(fused_kv[len(model.layers)], ref_kv[len(model.layers)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_and_pytorch_steps_share_the_cache(dtype, monkeypatch, counted):
    model = tiny(dtype)
    ids = torch.randint(0, 96, (16,)).tolist()
    mixed, mixed_kv = decode(model, ids, 3, True, monkeypatch, chunks=(6, 11))  # two 2-token PyTorch chunks
    assert counted["n"] == 9
    ref, ref_kv = decode(model, ids, 3, False, monkeypatch, chunks=(6, 11))
    assert_close(mixed, ref, dtype)
    for a, b in zip(mixed_kv, ref_kv):
        assert_close(a, b, dtype)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_generation_is_identical(dtype, tied, monkeypatch, counted):
    model = tiny(dtype, tie_embeddings=tied)
    prompt = [3, 14, 15, 92, 65]
    fused = generate(model, [prompt], 20, stop_tokens=[])
    assert counted["n"] == 19  # every token after the prefill's
    monkeypatch.setenv(ENV, "0")
    assert generate(model, [prompt], 20, stop_tokens=[]) == fused
    assert counted["n"] == 19
    assert len(set(fused[0])) > 3  # varied tokens: a real comparison


@pytest.mark.parametrize("overrides", [dict(preset="mistral", sliding_window=4, max_seq_len=16),
                                       dict(bias=True), dict(qkv_bias=True)],
                         ids=["sliding-window", "biases", "qkv-biases"])
@pytest.mark.parametrize("dtype", ["fp32", "q8_0"])
def test_windows_and_biases(dtype, overrides, monkeypatch, counted):
    model = tiny(dtype, **overrides)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1 and not torch.all(p == 1):  # the biases (norm gains stay 1)
                p.normal_(0, 0.5)
    ids = torch.randint(0, 96, (30,)).tolist()  # 30 positions: a window-4 cache of 8 rolls
    fused, _ = decode(model, ids, 5, True, monkeypatch)
    assert counted["n"] == 25
    ref, _ = decode(model, ids, 5, False, monkeypatch)
    assert_close(fused, ref, dtype)
    tokens = generate(model, [[5, 6, 7]], 24, stop_tokens=[])
    monkeypatch.setenv(ENV, "0")
    assert generate(model, [[5, 6, 7]], 24, stop_tokens=[]) == tokens


def test_rope_table_grows_and_matches_the_model(monkeypatch, counted):
    monkeypatch.setattr(fused_decode, "ROPE_ROWS", 2)  # grown at positions 2, 4, 8, 16
    model = tiny()
    ids = torch.randint(0, 96, (20,)).tolist()
    fused, _ = decode(model, ids, 1, True, monkeypatch)
    ref, _ = decode(model, ids, 1, False, monkeypatch)
    assert_close(fused, ref)
    cos, sin = model.rotary(torch.tensor([[17]]))
    table = FusedDecoder(None, model.rotary, None)._rope_table(17)
    assert torch.equal(table[0][17], cos.flatten()) and torch.equal(table[1][17], sin.flatten())


@pytest.mark.parametrize("case", ["gpt2", "mixtral", "bf16", "batch-2", "off"])
def test_unsupported_cases_fall_back_with_the_same_tokens(case, monkeypatch, counted):
    if case == "off":
        monkeypatch.setenv(ENV, "0")
    model = tiny("bf16" if case == "bf16" else "fp32", preset=case if case in ("gpt2", "mixtral") else "llama")
    prompts = [[1, 2, 3], [4, 5, 6]] if case == "batch-2" else [[1, 2, 3]]
    tokens = generate(model, prompts, 8, stop_tokens=[])
    assert counted["n"] == 0
    monkeypatch.setenv(ENV, "0")
    assert generate(model, prompts, 8, stop_tokens=[]) == tokens


def test_overflow_and_bad_tokens_behave_as_the_pytorch_path(monkeypatch):
    model = tiny()
    with torch.no_grad():
        model.setup_kv_cache(1, 3)
        model(torch.tensor([[1, 2, 3]]))
        with pytest.raises(ValueError, match="KV cache overflow"):
            model(torch.tensor([[4]]))
        model.setup_kv_cache(1, 3)
        with pytest.raises(IndexError):
            model(torch.tensor([[96]]))  # outside the vocabulary: nn.Embedding's error


def test_an_all_ones_mask_takes_the_fused_step_and_padding_does_not(monkeypatch, counted):
    model = tiny()
    with torch.no_grad():
        for fused in (True, False):
            monkeypatch.setenv(ENV, "1" if fused else "0")
            model.setup_kv_cache(1, 8)
            model(torch.tensor([[1, 2, 3]]))
            out = model(torch.tensor([[4]]), torch.ones(1, 4, dtype=torch.bool), torch.tensor([[3]])).logits
            padded = model(torch.tensor([[5]]), torch.tensor([[False, True, True, True, True]]),
                           torch.tensor([[3]])).logits  # a masked-out first position: the PyTorch path
            if fused:
                assert counted["n"] == 1
                fused_out, fused_padded = out, padded
    assert_close(fused_out, out)
    assert_close(fused_padded, padded)
