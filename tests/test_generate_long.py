"""Generation past the context length (issue 12 item 6): a model with learned, sinusoidal or (without
a sliding window) rotary positions conditions each token on the most recent max_seq_len tokens."""
import pytest
import torch

from attnlab import sampling
from attnlab.generate import context_window, generate
from attnlab.models.gpt import GPT, GPTConfig
from tests.conftest import spread_weights

V, CONTEXT = 50, 16
KINDS = {  # preset and overrides: learned (GPT-2), sinusoidal, RoPE without a sliding window (LLaMA)
    "learned": ("gpt2", {}), "sinusoidal": ("gpt2", {"positions": "sinusoidal"}), "rope": ("llama", {}),
}


def model_for(kind: str) -> GPT:
    """A random tiny model with max_seq_len 16 and larger-than-init matrices (varied tokens)."""
    preset, overrides = KINDS[kind]
    torch.manual_seed(0)
    cfg = GPTConfig.from_name(preset, vocab_size=V, d_model=32, n_heads=4, n_layers=2, max_seq_len=CONTEXT,
                              d_ff=48, **overrides)
    return spread_weights(GPT(cfg).eval())


def prompt(n: int, seed: int = 1) -> list[int]:
    return torch.randint(V, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def run(model, prompts, n, monkeypatch, **kwargs):
    """generate()'s tokens and the (steps, B, V) logits it sampled from."""
    seen, real = [], sampling.sample_next

    def record(logits, *args, **kw):
        seen.append(logits.clone())
        return real(logits, *args, **kw)

    with monkeypatch.context() as m:
        m.setattr(sampling, "sample_next", record)
        out = generate(model, prompts, n, **kwargs)
    return out, torch.stack(seen)


def last_window_logits(model, sequence: list[int]) -> torch.Tensor:
    """The model's own next-token logits (V,) on the last max_seq_len tokens, at positions 0.."""
    with torch.no_grad():
        return model(torch.tensor([sequence[-CONTEXT:]])).logits[0, -1]


@pytest.mark.parametrize("kind", KINDS)
def test_generates_40_tokens_with_a_16_token_context_cached_equals_uncached(kind, monkeypatch):
    """Issue 12 item 6: past max_seq_len generate() refused ("the prompt + max_new_tokens exceed the
    model's max_seq_len"); now 5 + 40 tokens come out, the same with and without the cache."""
    model = model_for(kind)
    p = prompt(5)
    for kwargs in (dict(), dict(temperature=1.0, seed=0)):  # greedy and sampled
        cached, lc = run(model, [p], 40, monkeypatch, **kwargs)
        plain, lp = run(model, [p], 40, monkeypatch, use_cache=False, **kwargs)
        assert len(cached[0]) == 40 and cached == plain
        torch.testing.assert_close(lc, lp, atol=1e-5, rtol=0)
    assert len(set(cached[0])) > 3  # the sampled text varies: the window really slides over new content
    assert model.caches is None


@pytest.mark.parametrize("kind", KINDS)
def test_each_token_is_conditioned_on_exactly_the_last_max_seq_len_tokens(kind, monkeypatch):
    model = model_for(kind)
    p = prompt(5)
    for use_cache in (True, False):
        out, logits = run(model, [p], 40, monkeypatch, use_cache=use_cache, temperature=1.0, seed=0)
        sequence = p + out[0]
        for step in range(40):
            expected = last_window_logits(model, sequence[:len(p) + step])
            torch.testing.assert_close(logits[step, 0], expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["learned", "rope"])
def test_a_prompt_longer_than_the_context_is_cut_to_its_last_max_seq_len_tokens(kind, monkeypatch):
    model = model_for(kind)
    long = prompt(2 * CONTEXT + 3)
    for use_cache in (True, False):
        out, logits = run(model, [long], 5, monkeypatch, use_cache=use_cache)
        torch.testing.assert_close(logits[0, 0], last_window_logits(model, long), atol=1e-5, rtol=0)
        assert out == run(model, [long[-CONTEXT:]], 5, monkeypatch, use_cache=use_cache)[0]


@pytest.mark.parametrize("kind", ["learned", "sinusoidal"])
def test_left_padded_batch_past_the_context_equals_each_prompt_alone(kind, monkeypatch):
    model = model_for(kind)
    prompts = [prompt(3, seed=2), prompt(7, seed=3)]
    for use_cache in (True, False):
        batch, lb = run(model, prompts, 30, monkeypatch, use_cache=use_cache)
        for i, p in enumerate(prompts):
            alone, la = run(model, [p], 30, monkeypatch, use_cache=use_cache)
            assert batch[i] == alone[0]
            torch.testing.assert_close(lb[:, i], la[:, 0], atol=1e-5, rtol=0)


def test_sampling_past_the_context_is_reproducible_and_cache_independent():
    model = model_for("learned")
    kwargs = dict(temperature=1.0, top_k=10, seed=3)
    a = generate(model, [prompt(4)], 50, **kwargs)
    assert generate(model, [prompt(4)], 50, **kwargs) == a
    assert generate(model, [prompt(4)], 50, use_cache=False, **kwargs) == a and len(a[0]) == 50


def test_context_window_is_max_seq_len_except_for_sliding_window_rope():
    assert context_window(model_for("learned")) == CONTEXT and context_window(model_for("rope")) == CONTEXT
    mistral = GPT(GPTConfig.from_name("mistral", vocab_size=V, d_model=32, n_heads=4, n_layers=1, max_seq_len=16))
    assert mistral.cfg.sliding_window == 8 and context_window(mistral) is None  # the rolling cache, as before
