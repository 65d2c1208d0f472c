"""The fused C++ decode engine (engines/fused.py over nn/fused_decode.*) against the reference engine.

fp32: logits and caches within 1e-5 of the largest |value| (fp32 summation order: the products and
attention add in another order). Quantized: the step runs PyTorch's own operations in PyTorch's order
everywhere except attention (the embedding, RMSNorm's sum, the int8 kernel, RoPE, SiLU through the
same Sleef exp), so a token into an empty cache gives bit-identical logits and layer 0's keys and
values are bit-identical at every step; past one position an activation lying within attention's
rounding of an int8 step boundary can round to the other step (a "flip", ~5 % of random tiny models),
so quantized logits are held to QUANT_BOUND, greedy tokens to equality. These comparisons with
the reference ask for fp32 caches (kv_dtype="fp32"; "auto" takes fp16 for quantized weights, whose
own properties tests/engines/test_kv_dtype.py states). A batched step gives each
sequence exactly (bit for bit) what its batch-1 step gives; the C++ prefill runs on either build of
the extension.
"""
from __future__ import annotations

import dataclasses
import platform

import pytest
import torch

import attnlab.engines.fused as fused_engine
import attnlab.nn.fused_decode as fused_decode
from attnlab.engines import FusedEngine, ReferenceEngine, choose_engine, engine_name
from attnlab.engines.fused import QUANT_BOUND
from attnlab.generate import generate
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn import cpu_tuning
from attnlab.nn.fused_decode import FusedDecoder
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.quant_kernel import get_tuning, kernel, set_tuning
from attnlab.nn.quant_linear import set_dtype
from tests.conftest import spread_weights
from tests.engines.test_reference import prompts, tiny_mamba

pytestmark = pytest.mark.skipif(kernel() != "cpp", reason="the C++ kernel is not available here (nn/quant_kernel.py)")

DTYPES = ("fp32", "q8_0", "q4_0", "q4_1")
BOUND = 1e-5  # of the largest |value|: fp32


def tiny(dtype: str = "fp32", preset: str = "llama", **overrides) -> GPT:
    """A random LLaMA-style model with GQA (4 heads, 2 kv heads), weights spread so tokens vary."""
    torch.manual_seed(0)
    sizes = dict(vocab_size=96, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=512)
    if preset != "gpt2":
        sizes["n_kv_heads"] = 2
    model = spread_weights(GPT(GPTConfig.from_name(preset, **{**sizes, **overrides})).eval())
    return set_dtype(model, dtype)


def assert_close(a: torch.Tensor, b: torch.Tensor, dtype: str = "fp32") -> None:
    bound = BOUND if dtype == "fp32" else QUANT_BOUND
    assert (a - b).abs().max() <= bound * b.abs().max(), float((a - b).abs().max() / b.abs().max())


def feed(engine, prompt: list[int], rest: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Prefill `prompt` into slot 0, step through `rest`; the steps' logits (len(rest), V) and the caches."""
    engine.prefill([0], [prompt])
    logits = torch.stack([engine.step([0], [t])[0] for t in rest])
    held = engine.caches.held(0)
    return logits, [k[0, :, :held].clone() for k in engine.caches.k + engine.caches.v]


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_steps_equal_the_reference(dtype, tied):
    model = tiny(dtype, tie_embeddings=tied)
    ids = torch.randint(0, 96, (14,)).tolist()
    fused, fused_kv = feed(FusedEngine(model, 1, 32, kv_dtype="fp32"), ids[:5], ids[5:])
    ref, ref_kv = feed(ReferenceEngine(model, 1, 32), ids[:5], ids[5:])
    assert_close(fused, ref, dtype)
    for a, b in zip(fused_kv, ref_kv):
        assert_close(a, b, dtype)
    if dtype != "fp32":  # layer 0's keys and values: embedding, RMSNorm, int8 q|k|v, RoPE, all PyTorch's
        n = len(model.layers)
        assert torch.equal(fused_kv[0], ref_kv[0]) and torch.equal(fused_kv[n], ref_kv[n])


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_token_into_an_empty_cache_is_pytorchs_bit_for_bit_when_quantized(dtype):
    model = tiny(dtype)
    decoder = FusedDecoder.build(embed=model.embed_tokens, layers=model.layers, norm=model.norm,
                                 lm_head=model.lm_head, rotary=model.rotary)
    k = [torch.zeros(1, 2, 4, 16) for _ in model.layers]
    v = [torch.zeros(1, 2, 4, 16) for _ in model.layers]
    fused = decoder.step([7], [0], [0], [0], [0], k, v)[0]
    model.caches = [KVCache(1, 2, 4, 16) for _ in model.layers]
    with torch.no_grad():
        ref = model(torch.tensor([[7]])).logits[0, -1]
    if dtype == "fp32":
        assert_close(fused, ref)
    else:  # attention over one position: every operation the same
        assert torch.equal(fused, ref)
        assert torch.equal(k[0][:, :, :1], model.caches[0].k[:, :, :1])
    model.clear_kv_cache()


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_step_is_each_sequence_alone_bit_for_bit(dtype):
    model = tiny(dtype)
    batch = prompts((1, 7, 64, 300))
    engine = FusedEngine(model, 5, 310)
    slots = [3, 0, 4, 1]
    logits = [engine.prefill(slots, batch)]
    tokens = [row.argmax(-1).tolist() for row in logits[-1:]]
    for _ in range(4):
        logits.append(engine.step(slots, tokens[-1]))
        tokens.append(logits[-1].argmax(-1).tolist())
    for row, prompt in enumerate(batch):
        alone, reference = FusedEngine(model, 1, 310), ReferenceEngine(model, 1, 310)
        first = alone.prefill([0], [prompt])[0]
        assert torch.equal(first, logits[0][row])  # prefilled alone or beside others: the same bits
        assert_close(first, reference.prefill([0], [prompt])[0], dtype)
        for step in range(4):
            token = [tokens[step][row]]
            one = alone.step([0], token)[0]
            assert torch.equal(logits[step + 1][row], one)
            assert_close(one, reference.step([0], token)[0], dtype)


@pytest.mark.parametrize("heads", [(8, 2, 64), (4, 1, 48), (6, 2, 120), (3, 3, 96)],
                         ids=["group4-dh8", "group4-dh12", "group3-dh20", "mha-dh32"])
def test_attention_of_any_group_and_head_size_equals_the_reference(heads):
    # decode_attention.h takes a kv head's query heads 4 (AVX512) or 3 (AVX2) per pass, Dh in 16- or
    # 8-lane chunks (the rest one by one): groups of 4 (two passes on AVX2), 3 and 1; Dh 8, 12, 20, 32
    n_heads, n_kv_heads, d_model = heads
    model = tiny("fp32", n_heads=n_heads, n_kv_heads=n_kv_heads, d_model=d_model)
    batch = prompts((1, 9, 70))
    engine, reference, mha = FusedEngine(model, 3, 80), ReferenceEngine(model, 3, 80), FusedEngine(mha_copy(model), 3, 80)
    assert_close(engine.prefill(range(3), batch), reference.prefill(range(3), batch))
    mha.prefill(range(3), batch)
    for tokens in ([5, 6, 7], [8, 9, 10]):
        batched = engine.step(range(3), tokens)
        assert_close(batched, reference.step(range(3), tokens))
        assert torch.equal(batched, mha.step(range(3), tokens))  # a head's bits, its kv head shared or not
    alone = FusedEngine(model, 1, 80)
    alone.prefill([0], [batch[2]])
    alone.step([0], [7])
    assert torch.equal(alone.step([0], [10])[0], batched[2])  # a sequence's bits, batched or alone


@pytest.mark.parametrize("dtype", ["fp32", "q4_1"])
def test_prefill_chunks_give_the_same_bits_whatever_their_size(dtype, monkeypatch):
    model = tiny(dtype)
    prompt = prompts((300,))[0]
    whole = FusedEngine(model, 1, 310)
    first = whole.prefill([0], [prompt])
    monkeypatch.setattr(fused_engine, "PREFILL_CHUNK", 7)
    chunked = FusedEngine(model, 1, 310)
    assert torch.equal(chunked.prefill([0], [prompt]), first)
    held = whole.caches.held(0)
    assert all(torch.equal(a[0, :, :held], b[0, :, :held]) for a, b in zip(whole.caches.k, chunked.caches.k))
    assert torch.equal(whole.step([0], [3]), chunked.step([0], [3]))


@pytest.mark.parametrize("dtype", ["fp32", "q8_0"])
def test_prefill_of_a_rolling_cache_equals_the_reference(dtype):
    model = tiny(dtype, preset="mistral", sliding_window=8, max_seq_len=64)
    prompt = prompts((40,))[0]  # a capacity-16 cache rolls during the prefill
    fused, reference = FusedEngine(model, 1, 64), ReferenceEngine(model, 1, 64)
    assert_close(fused.prefill([0], [prompt]), reference.prefill([0], [prompt]), dtype)
    for t in (5, 6, 7):
        assert_close(fused.step([0], [t]), reference.step([0], [t]), dtype)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_generation_is_identical(dtype, tied):
    model = tiny(dtype, tie_embeddings=tied)
    batch = [[3, 14, 15, 92, 65], [2, 7]]
    fused = generate(model, batch, 20, stop_tokens=[], engine="fused-cpp", kv_dtype="fp32")
    assert generate(model, batch, 20, stop_tokens=[], engine="reference") == fused
    assert len(set(fused[0])) > 3 and len(set(fused[1])) > 3  # varied tokens: a real comparison


@pytest.mark.parametrize("overrides", [dict(preset="mistral", sliding_window=4, max_seq_len=16),
                                       dict(bias=True), dict(qkv_bias=True)],
                         ids=["sliding-window", "biases", "qkv-biases"])
@pytest.mark.parametrize("dtype", ["fp32", "q8_0"])
def test_windows_and_biases(dtype, overrides):
    model = tiny(dtype, **overrides)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1 and not torch.all(p == 1):  # the biases (norm gains stay 1)
                p.normal_(0, 0.5)
    ids = torch.randint(0, 96, (30,)).tolist()  # 30 positions: a window-4 cache of 8 rolls
    fused, _ = feed(FusedEngine(model, 1, 64, kv_dtype="fp32"), ids[:5], ids[5:])
    ref, _ = feed(ReferenceEngine(model, 1, 64), ids[:5], ids[5:])
    assert_close(fused, ref, dtype)
    batch = [[5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9]]
    tokens = generate(model, batch, 24, stop_tokens=[], engine="fused-cpp", kv_dtype="fp32")
    assert generate(model, batch, 24, stop_tokens=[], engine="reference") == tokens


def test_rope_table_grows_and_matches_the_model(monkeypatch):
    monkeypatch.setattr(fused_decode, "ROPE_ROWS", 2)  # grown at positions 2, 4, 8, 16
    model = tiny()
    ids = torch.randint(0, 96, (20,)).tolist()
    fused, _ = feed(FusedEngine(model, 1, 32), ids[:1], ids[1:])
    ref, _ = feed(ReferenceEngine(model, 1, 32), ids[:1], ids[1:])
    assert_close(fused, ref)
    cos, sin = model.rotary(torch.tensor([[17]]))
    table = FusedDecoder(None, model.rotary)._rope_table(17)
    assert torch.equal(table[0][17], cos.flatten()) and torch.equal(table[1][17], sin.flatten())


@pytest.mark.parametrize("case, reason", [("gpt2", "absolute"), ("mixtral", "MixtureOfExperts"), ("bf16", "bfloat16"),
                                          ("mamba", "Mamba"), ("training", "training mode")])
def test_the_rule_names_why_the_fused_engine_does_not_apply(case, reason):
    if case == "mamba":
        model = tiny_mamba()
    else:
        model = tiny("bf16" if case == "bf16" else "fp32", preset=case if case in ("gpt2", "mixtral") else "llama")
    model.train(case == "training")
    assert reason in FusedEngine.unsupported(model)
    assert engine_name(model) == engine_name(model) == "reference"  # the same choice at every call
    assert choose_engine(model, 2, 16).name == "reference"
    with pytest.raises(ValueError, match=f"engine='fused-cpp' does not run this model: .*{reason}"):
        choose_engine(model, 2, 16, "fused-cpp")
    model.eval()
    assert generate(model, [[1, 2, 3], [4]], 6, stop_tokens=[]) == \
        generate(model, [[1, 2, 3], [4]], 6, stop_tokens=[], engine="reference")


def test_the_rule_picks_the_fused_engine_for_llama_style_models():
    for dtype in DTYPES:
        model = tiny(dtype)
        assert FusedEngine.unsupported(model) is None
        assert engine_name(model) == engine_name(model) == "fused-cpp"
        assert isinstance(choose_engine(model, 2, 16), FusedEngine)
    with pytest.raises(ValueError, match="engine='fast' is not one of auto, fused-cpp, reference"):
        engine_name(tiny(), "fast")


def test_contract_errors_and_slot_reuse():
    model = tiny()
    engine = FusedEngine(model, 2, 8)
    engine.prefill([0, 1], [[1, 2, 3], [4, 5]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.step([0], [96])
    engine.step([1, 0], [6, 7])
    engine.release(0)
    with pytest.raises(ValueError, match="free"):
        engine.step([0, 1], [1, 2])
    again = engine.prefill([0], [[9]])
    fresh = FusedEngine(model, 1, 8)
    assert torch.equal(again, fresh.prefill([0], [[9]]))
    assert torch.equal(engine.step([0, 1], [3, 4])[0], fresh.step([0], [3])[0])
    assert engine.length(0) == 2 and engine.length(1) == 4


@pytest.mark.parametrize("dtype", ["fp32", "q4_1"])
def test_the_step_gives_the_same_bits_on_one_thread_and_on_two_in_either_threading_form(dtype):
    model = tiny(dtype)
    batch = prompts((3, 9, 40))
    before, tuning = torch.get_num_threads(), get_tuning()
    out = []
    try:
        for threads, one_region in ((1, 1), (2, 1), (2, 0)):
            torch.set_num_threads(threads)
            set_tuning(parallel_bytes=64, one_region=one_region)  # split even these tiny products
            engine = FusedEngine(model, 3, 64)
            engine.prefill(range(3), batch)
            out.append(torch.stack([engine.step(range(3), [5, 6, 7]) for _ in range(3)]))
    finally:
        torch.set_num_threads(before)
        set_tuning(**tuning)
    assert torch.equal(out[0], out[1]) and torch.equal(out[0], out[2])


@pytest.mark.parametrize("dtype", ["fp32", "q8_0", "q4_1"])
def test_the_prefetch_settings_change_no_bit(dtype, monkeypatch):
    # prefetch_spread / prefetch_kv / prefetch_l2 / the distances only ask for memory earlier
    # (nn/cpu_tuning.py): every setting gives the step the same logits, in 16-row tiles and in rows
    monkeypatch.setenv(cpu_tuning.TILE_ENV, "16")
    model = tiny(dtype, d_model=128, d_ff=256)
    batch, tuning = prompts((1, 7, 64, 300)), get_tuning()
    out = []
    try:
        for setting in ({"prefetch_spread": 0, "prefetch_kv": 1}, {"prefetch_spread": 1, "prefetch_kv": 2},
                        {"prefetch_spread": 1, "prefetch_kv": 0, "prefetch_l2": 0}, {"prefetch_q": 0, "prefetch_f32": 0},
                        {"prefetch_spread": 1, "prefetch_kv": 2, "prefetch_q": 256, "prefetch_f32": 256}):
            set_tuning(**{**tuning, **setting})
            engine = FusedEngine(model, 4, 310)
            out.append(torch.stack([engine.prefill(range(4), batch)] +
                                   [engine.step(range(4), [5, 6, 7, 8]) for _ in range(3)]))
    finally:
        set_tuning(**tuning)
    assert all(torch.equal(out[0], o) for o in out[1:])


def collapse_supported() -> bool:
    """Linux 6.1 or later: madvise(MADV_COLLAPSE) exists (nn/huge_pages.h)."""
    release = platform.release().split(".")
    return platform.system() == "Linux" and tuple(int(x) for x in release[:2] if x.isdigit()) >= (6, 1)


@pytest.mark.parametrize("dtype", ["fp32", "q8_0"])
def test_weights_on_huge_pages_change_no_bit(dtype):
    # nn/huge_pages.h moves the plan's weights onto 2 MiB pages in place: the same logits, and the
    # plan says how many bytes moved (none when asked not to; some where the kernel has MADV_COLLAPSE)
    model = tiny(dtype, d_model=128, d_ff=256)
    batch, tuning = prompts((1, 7, 64)), get_tuning()
    out, moved = [], []
    try:
        for huge in (0, 1):
            set_tuning(**{**tuning, "huge_pages": huge})
            engine = FusedEngine(model, 3, 80)
            moved.append(engine.decoder.plan.huge_page_bytes())
            out.append(torch.stack([engine.prefill(range(3), batch)] +
                                   [engine.step(range(3), [5, 6, 7]) for _ in range(3)]))
    finally:
        set_tuning(**tuning)
    assert torch.equal(out[0], out[1])
    assert moved[0] == 0 and moved[1] % (1 << 21) == 0
    if collapse_supported():
        assert moved[1] > 0


def test_a_bad_tuning_value_is_named():
    with pytest.raises(RuntimeError, match="prefetch_kv 0/1/2"):
        set_tuning(prefetch_kv=3)
    with pytest.raises(RuntimeError, match="huge_pages 0/1"):
        set_tuning(huge_pages=2)
    with pytest.raises(KeyError, match="unknown tuning field 'prefetch_far'"):
        set_tuning(prefetch_far=1)


def mha_copy(model: GPT) -> GPT:
    """`model` (GQA) with each kv head repeated for the query heads that read it: the same function."""
    cfg = model.cfg
    twin = GPT(dataclasses.replace(cfg, n_kv_heads=cfg.n_heads)).eval()
    state, group = model.state_dict(), cfg.n_heads // cfg.n_kv_heads
    for name, value in list(state.items()):
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            state[name] = value.view(cfg.n_kv_heads, -1, cfg.d_model).repeat_interleave(group, 0).flatten(0, 1)
    twin.load_state_dict(state)
    return twin


def test_a_head_gets_the_same_bits_whether_its_kv_head_is_shared_or_not():
    # attention takes a kv head's query heads in one pass (nn/decode_attention.h): each head's
    # arithmetic stays its own, so GQA and its MHA copy give the same logits bit for bit
    model = tiny("fp32")
    batch = prompts((1, 7, 64))
    out = []
    for m in (model, mha_copy(model)):
        engine = FusedEngine(m, 3, 80)
        out.append(torch.stack([engine.prefill(range(3), batch)] + [engine.step(range(3), [5, 6, 7]) for _ in range(3)]))
    assert torch.equal(out[0], out[1])


@pytest.mark.parametrize("dtype", ["fp32", "q8_0"])
def test_attention_split_by_context_length_over_two_threads_gives_the_same_bits(dtype):
    # sequences of very different lengths: the members' shares of attention follow the slots read
    # (fused_decode.cpp attention); every head is still one thread's, in one order
    model = tiny(dtype)
    batch = prompts((1, 7, 64, 300))
    before, tuning = torch.get_num_threads(), get_tuning()
    out = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            set_tuning(one_region=1)
            engine = FusedEngine(model, 4, 310)
            engine.prefill(range(4), batch)
            out.append(torch.stack([engine.step(range(4), [5, 6, 7, 8]) for _ in range(3)]))
    finally:
        torch.set_num_threads(before)
        set_tuning(**tuning)
    assert torch.equal(out[0], out[1])
