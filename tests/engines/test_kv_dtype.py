"""The fused engine's fp16 KV cache (engines/fused.py cache_dtype, nn/fused_decode.cpp).

A key or value is rounded to fp16 once, when written, and read back exactly: layer 0's keys and values
(computed before any attention) are the fp32 cache's rounded to nearest, bit for bit; the logits stay
within FP16_BOUND of the fp32 cache's (fp32 weights) or QUANT_BOUND (quantized); a batched step still
gives each sequence the bits of its batch-1 step. "auto" picks fp16 for block-quantized weights only.
"""
from __future__ import annotations

import pytest
import torch

import attnlab.engines.fused as fused_engine
from attnlab.engines import FusedEngine, choose_engine, engine_name
from attnlab.engines.fused import QUANT_BOUND, cache_dtype
from attnlab.errors import UserError
from attnlab.nn.quant_kernel import kernel
from tests.engines.test_fused import feed, prompts, tiny

pytestmark = pytest.mark.skipif(kernel() != "cpp", reason="the C++ kernel is not available here (nn/quant_kernel.py)")

FP16_BOUND = 1e-2  # of the largest |logit|: fp16 against fp32 caches, fp32 weights (tiny models: ~1e-3)


@pytest.mark.parametrize("dtype, expected", [("fp32", "fp32"), ("q8_0", "fp16"), ("q4_0", "fp16"), ("q4_1", "fp16")])
def test_auto_takes_fp16_for_quantized_weights_only(dtype, expected):
    model = tiny(dtype)
    assert cache_dtype(model) == expected
    engine = FusedEngine(model, 2, 16)
    assert engine.kv_dtype == expected
    assert all(c.dtype == fused_engine.KV_DTYPES[expected] for c in engine.caches.k + engine.caches.v)


@pytest.mark.parametrize("dtype, sizes", [("fp32", {}), ("q8_0", {}), ("q4_0", {}), ("q4_1", {}),
                                          ("fp32", dict(d_model=80, n_heads=4))],  # head_dim 20: 8-lane stores + a tail
                         ids=["fp32", "q8_0", "q4_0", "q4_1", "fp32-head_dim20"])
def test_an_fp16_cache_holds_the_fp32_caches_keys_rounded(dtype, sizes):
    model = tiny(dtype, **sizes)
    ids = torch.randint(0, 96, (40,)).tolist()
    full, full_kv = feed(FusedEngine(model, 1, 48, kv_dtype="fp32"), ids[:9], ids[9:])
    half, half_kv = feed(FusedEngine(model, 1, 48, kv_dtype="fp16"), ids[:9], ids[9:])
    n = len(model.layers)
    assert half_kv[0].dtype == torch.float16
    assert torch.equal(half_kv[0], full_kv[0].half()) and torch.equal(half_kv[n], full_kv[n].half())
    assert not torch.equal(half, full)  # the rounding reached the logits: a real comparison
    bound = FP16_BOUND if dtype == "fp32" else QUANT_BOUND
    assert (half - full).abs().max() <= bound * full.abs().max()


@pytest.mark.parametrize("dtype", ["fp32", "q4_1"])
def test_a_batched_step_over_fp16_caches_is_each_sequence_alone_bit_for_bit(dtype):
    model = tiny(dtype)
    batch = prompts((1, 7, 64, 300))
    engine = FusedEngine(model, 4, 310, kv_dtype="fp16")
    logits = [engine.prefill(range(4), batch)] + [engine.step(range(4), [5, 6, 7, 8]) for _ in range(3)]
    for row, prompt in enumerate(batch):
        alone = FusedEngine(model, 1, 310, kv_dtype="fp16")
        mine = [alone.prefill([0], [prompt])[0]] + [alone.step([0], [5 + row])[0] for _ in range(3)]
        assert all(torch.equal(a, b[row]) for a, b in zip(mine, logits))


def test_a_bad_kv_dtype_is_named():
    model = tiny("q8_0")
    with pytest.raises(UserError, match=r"kv_dtype='bf16' is not one of auto, fp32, fp16"):
        cache_dtype(model, "bf16")
    with pytest.raises(UserError, match="kv_dtype='fp16' needs the fused engine"):
        choose_engine(model, 1, 8, engine="reference", kv_dtype="fp16")
    with pytest.raises(UserError, match="kv_dtype='fp16' needs the fused engine"):
        engine_name(tiny("fp32", preset="gpt2"), "auto", "fp16")  # GPT-2 style: the reference engine's
    assert choose_engine(model, 1, 8, kv_dtype="fp32").caches.k[0].dtype == torch.float32
