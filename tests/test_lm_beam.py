"""Beam search for decoder-only models (lm_beam.py): one beam is greedy decoding; a beam wide enough
to keep every candidate finds the best sequence under the scoring rule (brute force); a batch of
left-padded prompts gives each prompt's own result."""
from __future__ import annotations

import itertools

import pytest
import torch

from attnlab.generate import generate, length_penalty
from attnlab.lm_beam import lm_beam_search
from attnlab.models.gpt import GPT, GPTConfig
from tests.conftest import spread_weights

STOP = 0


def _model(vocab: int = 16, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig.from_name("llama", vocab_size=vocab, d_model=32, n_layers=2, n_heads=4, max_seq_len=64,
                              eos_id=STOP)
    return spread_weights(GPT(cfg), 0.3).eval()


PROMPTS = [[3, 4, 5, 6], [7, 8], [9, 10, 11, 12, 13, 14]]


def test_one_beam_is_greedy():
    model = _model()
    assert lm_beam_search(model, PROMPTS, 1, 12, [STOP]) == generate(model, PROMPTS, 12, stop_tokens=[STOP])


def _score(model, prompt: list[int], new: list[int], max_new: int, alpha: float) -> float:
    """The scoring rule: log P(new + stop) / lp(|new| + 1), or log P(new) / lp(max_new) when cut."""
    finished = len(new) < max_new
    seq = prompt + new + ([STOP] if finished else [])
    with torch.no_grad():
        logp = model(torch.tensor([seq])).logits[0].float().log_softmax(-1)
    total = sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(seq[len(prompt):]))
    return total / length_penalty(len(seq) - len(prompt), alpha)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_a_beam_that_prunes_nothing_equals_brute_force(alpha):
    vocab, max_new = 4, 3
    model = _model(vocab, seed=1)
    prompt = [1, 2, 3]
    candidates = [list(c[:n]) for n in range(max_new + 1) for c in itertools.product(range(1, vocab), repeat=n)]
    best = max(candidates, key=lambda c: _score(model, prompt, c, max_new, alpha))
    found = lm_beam_search(model, [prompt], vocab ** max_new, max_new, [STOP], alpha)[0]
    assert abs(_score(model, prompt, found, max_new, alpha) - _score(model, prompt, best, max_new, alpha)) < 1e-5


def test_batched_prompts_get_their_own_results():
    model = _model()
    together = lm_beam_search(model, PROMPTS, 3, 10, [STOP])
    assert together == [lm_beam_search(model, [p], 3, 10, [STOP])[0] for p in PROMPTS]
    greedy = generate(model, PROMPTS, 10, stop_tokens=[STOP])
    for prompt, b, g in zip(PROMPTS, together, greedy):
        assert _score(model, prompt, b, 10, 0.6) >= _score(model, prompt, g, 10, 0.6) - 1e-5


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="beam_size"):
        lm_beam_search(_model(), PROMPTS, 0, 5)
    with pytest.raises(ValueError, match="early_stopping"):
        lm_beam_search(_model(), PROMPTS, 2, 5, early_stopping="never")
