"""The reference decode engine (engines/reference.py): per-slot caches of different lengths in one
batched step equal batch-1 decoding of each sequence, and generate()'s tokens."""
from __future__ import annotations

import pytest
import torch

from attnlab.engines import DecodeEngine, ReferenceEngine
from attnlab.generate import generate
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.mamba import Mamba, MambaConfig
from attnlab.nn.quant_linear import set_dtype
from tests.conftest import spread_weights

BOUND = 1e-5  # of the largest |logit|: fp32 summation order (batched products, padded attention)
LENGTHS = (1, 7, 64, 300)


def tiny_gpt(preset: str = "llama", dtype: str = "fp32", **overrides) -> GPT:
    torch.manual_seed(0)
    sizes = dict(vocab_size=96, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=512)
    if preset != "gpt2":
        sizes["n_kv_heads"] = 2
    return set_dtype(spread_weights(GPT(GPTConfig.from_name(preset, **{**sizes, **overrides})).eval()), dtype)


def tiny_mamba() -> Mamba:
    """A random Mamba whose projections are spread (std 0.3) so that greedy tokens vary."""
    torch.manual_seed(0)
    model = Mamba(MambaConfig(vocab_size=96, d_model=32, n_layers=2, d_state=8, max_seq_len=512)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("proj.weight") or name.startswith("embed"):
                p.normal_(0, 0.3)
    return model


def prompts(lengths=LENGTHS, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 96, (n,), generator=g).tolist() for n in lengths]


def greedy(engine, slots, batch, new: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy tokens of `batch` prompts in `slots` decoded together, and each step's (N, V) logits."""
    logits = engine.prefill(slots, batch)
    out, seen = [[] for _ in slots], [logits]
    for step in range(new):
        nxt = logits.argmax(-1).tolist()
        for row, t in enumerate(nxt):
            out[row].append(t)
        if step == new - 1:
            break
        logits = engine.step(slots, nxt)
        seen.append(logits)
    return out, seen


def assert_close(a: torch.Tensor, b: torch.Tensor, bound: float = BOUND) -> None:
    assert (a - b).abs().max() <= bound * b.abs().max(), float((a - b).abs().max() / b.abs().max())


MODELS = {"llama": lambda: tiny_gpt("llama"), "gpt2": lambda: tiny_gpt("gpt2"),
          "mistral-rolling": lambda: tiny_gpt("mistral", sliding_window=16, max_seq_len=32),
          "mixtral": lambda: tiny_gpt("mixtral", n_experts=4, moe_top_k=2), "mamba": tiny_mamba}


@pytest.mark.parametrize("kind", MODELS)
def test_batched_step_equals_batch_one_per_sequence(kind):
    model = MODELS[kind]()
    batch = prompts()
    engine = ReferenceEngine(model, max_batch=6, max_len=310)
    assert isinstance(engine, DecodeEngine)
    slots = [4, 0, 5, 2]  # any slots, in any order
    tokens, logits = greedy(engine, slots, batch, 6)
    assert [engine.length(s) for s in slots] == [n + 5 for n in LENGTHS]
    for row, prompt in enumerate(batch):
        alone = ReferenceEngine(model, max_batch=1, max_len=310)
        one_tokens, one_logits = greedy(alone, [0], [prompt], 6)
        assert tokens[row] == one_tokens[0]
        for a, b in zip(logits, one_logits):
            assert_close(a[row], b[0])


@pytest.mark.parametrize("kind", ["llama", "gpt2", "mamba"])
def test_tokens_equal_generate(kind):
    model, batch = MODELS[kind](), prompts()
    engine = ReferenceEngine(model, max_batch=4, max_len=312)
    tokens, _ = greedy(engine, range(4), batch, 8)
    assert tokens == generate(model, batch, max_new_tokens=8, stop_tokens=[])
    assert tokens == [generate(model, [p], max_new_tokens=8, stop_tokens=[])[0] for p in batch]


def test_quantized_model_tokens_equal_batch_one():
    model = tiny_gpt("llama", "q8_0")
    batch = prompts((3, 40, 9))
    tokens, _ = greedy(ReferenceEngine(model, 3, 64), [0, 1, 2], batch, 6)
    assert tokens == [greedy(ReferenceEngine(model, 1, 64), [0], [p], 6)[0][0] for p in batch]


def test_a_released_slot_starts_afresh_and_others_go_on():
    model, batch = tiny_gpt(), prompts((5, 9, 12))
    engine = ReferenceEngine(model, max_batch=2, max_len=64)
    engine.prefill([0, 1], batch[:2])
    engine.step([0, 1], [3, 4])
    engine.release(1)
    engine.release(1)  # freeing a free slot does nothing
    assert engine.length(1) == 0 and engine.length(0) == 6
    first = engine.prefill([1], [batch[2]])
    joined = engine.step([1, 0], [5, 6])
    fresh = ReferenceEngine(model, 1, 64)
    assert_close(first[0], fresh.prefill([0], [batch[2]])[0])
    assert_close(joined[0], fresh.step([0], [5])[0])
    alone = ReferenceEngine(model, 1, 64)
    alone.prefill([0], [batch[0]])
    alone.step([0], [3])
    assert_close(joined[1], alone.step([0], [6])[0])


def test_sliding_window_rolls_each_slot_on_its_own():
    model = tiny_gpt("mistral", sliding_window=8, max_seq_len=64)
    batch = prompts((3, 20))
    engine = ReferenceEngine(model, 2, 64)
    assert engine.caches.capacity == 16  # 2 W
    tokens, _ = greedy(engine, [0, 1], batch, 30)
    assert tokens == generate(model, batch, max_new_tokens=30, stop_tokens=[])


def test_contract_errors_are_value_errors():
    model = tiny_gpt(max_seq_len=32)
    with pytest.raises(ValueError, match="max_seq_len"):
        ReferenceEngine(model, 2, 33)
    with pytest.raises(ValueError, match="max_batch"):
        ReferenceEngine(model, 0, 8)
    engine = ReferenceEngine(model, 2, 8)
    for slots, batch, match in (([2], [[1]], "out of range"), ([0], [[]], "at least one token"),
                                ([0], [[1] * 9], "does not fit"), ([0], [[96]], "outside the vocabulary"),
                                ([0, 0], [[1], [2]], "twice"), ([0], [[1], [2]], "2 prompts")):
        with pytest.raises(ValueError, match=match):
            engine.prefill(slots, batch)
    with pytest.raises(ValueError, match="free"):
        engine.step([0], [1])
    engine.prefill([0], [[1] * 7])
    with pytest.raises(ValueError, match="busy"):
        engine.prefill([0], [[1]])
    engine.step([0], [2])
    with pytest.raises(ValueError, match="full"):
        engine.step([0], [3])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.prefill([1], [[-1]])
