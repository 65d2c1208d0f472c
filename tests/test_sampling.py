import pytest
import torch

from attnlab.models.gpt import GPTConfig
from attnlab.generate import generate
from attnlab.models.gpt import GPT
from attnlab.sampling import check_sampling, sample_next, top_k_filter, top_p_filter

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def random_model(preset="llama"):
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name(preset, vocab_size=50, d_model=32, n_heads=4, n_layers=2, max_seq_len=64)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
    return model


PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8]]


# ----------------------------------------------------------------------------- filters
@pytest.mark.parametrize("p,kept", [(0.3, 1), (0.5, 1), (0.51, 2), (0.7, 2), (0.8, 2), (0.81, 3), (0.96, 4), (1.0, 4)])
def test_top_p_keeps_smallest_set_reaching_p(p, kept):
    out = top_p_filter(PROBS.log()[None], p)
    assert torch.isfinite(out).sum().item() == kept
    assert torch.isfinite(out[0, :kept]).all()  # the most probable ones
    torch.testing.assert_close(out[0, :kept], PROBS.log()[:kept])


def test_top_p_works_in_vocabulary_order_per_row():
    order = torch.tensor([2, 0, 3, 1])  # vocabulary ids of 0.15, 0.5, 0.05, 0.3
    shuffled = PROBS[order]
    logits = torch.stack([shuffled.log(), PROBS.log()])
    out = top_p_filter(logits, 0.7)
    assert torch.isfinite(out[0]).tolist() == [False, True, False, True]
    assert torch.isfinite(out[1]).tolist() == [True, True, False, False]


def test_top_k_keeps_the_k_largest():
    torch.manual_seed(0)
    logits = torch.randn(3, 20)
    for k in (1, 3, 20, 25):
        out = top_k_filter(logits, k)
        kept = torch.isfinite(out)
        assert (kept.sum(-1) == min(k, 20)).all()
        top = logits.topk(min(k, 20), dim=-1).indices
        assert kept.gather(-1, top).all()
        torch.testing.assert_close(out[kept], logits[kept])


def test_top_k_keeps_ties_at_the_kth_value():
    out = top_k_filter(torch.tensor([[3.0, 1.0, 2.0, 2.0]]), 2)
    assert torch.isfinite(out).tolist() == [[True, False, True, True]]


# ----------------------------------------------------------------------------- sampling
def frequencies(n=20000, **kwargs):
    g = torch.Generator().manual_seed(0)
    draws = sample_next(PROBS.log().expand(n, 4), generator=g, **kwargs)
    return torch.bincount(draws, minlength=4).float() / n


@pytest.mark.parametrize("kwargs,expected", [
    (dict(), PROBS),
    (dict(temperature=0.5), PROBS ** 2 / (PROBS ** 2).sum()),
    (dict(top_k=2), torch.tensor([0.625, 0.375, 0, 0])),
    (dict(top_p=0.7), torch.tensor([0.625, 0.375, 0, 0])),
    (dict(top_k=3, top_p=0.9), torch.tensor([0.5, 0.3, 0.15, 0]) / 0.95),
])
def test_sample_frequencies_match_probabilities(kwargs, expected):
    freq = frequencies(**kwargs)
    assert (freq - expected).abs().max() < 0.02, (freq, expected)
    assert (freq[expected == 0] == 0).all()


def test_temperature_zero_is_argmax():
    logits = torch.randn(5, 30)
    assert torch.equal(sample_next(logits, temperature=0.0), logits.argmax(-1))


def test_top_k_one_equals_greedy_in_generate():
    model = random_model()
    greedy = generate(model, PROMPTS, 15, temperature=0.0)
    for seed in (0, 1):
        assert generate(model, PROMPTS, 15, temperature=1.0, top_k=1, seed=seed) == greedy
    assert generate(model, PROMPTS, 15, temperature=1.0, top_p=1e-6, seed=3) == greedy  # nucleus of one token


def test_same_seed_same_tokens_other_seed_differs():
    model = random_model()
    a = generate(model, PROMPTS, 20, temperature=1.0, seed=7)
    assert generate(model, PROMPTS, 20, temperature=1.0, seed=7) == a
    assert generate(model, PROMPTS, 20, temperature=1.0, seed=7, use_cache=False) == a
    assert generate(model, PROMPTS, 20, temperature=1.0, seed=8) != a


def test_stop_token_ends_only_its_row_and_is_not_returned():
    model = random_model()
    greedy = generate(model, PROMPTS, 10)
    stop = greedy[0][2]
    assert stop not in greedy[0][:2]
    streamed = []
    out = generate(model, PROMPTS, 10, stop_tokens=[stop], on_token=lambda row, tok: streamed.append((row, tok)))
    assert out[0] == greedy[0][:2]
    cut = greedy[1].index(stop) if stop in greedy[1] else 10
    assert out[1] == greedy[1][:cut]
    assert [t for r, t in streamed if r == 0] == out[0] and [t for r, t in streamed if r == 1] == out[1]


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs,name", [
    (dict(temperature=-1.0), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=0), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
])
def test_bad_sampling_arguments_raise_naming_them(kwargs, name):
    args = {"temperature": 1.0, **kwargs}
    for call in (lambda: check_sampling(args["temperature"], args.get("top_k"), args.get("top_p")),
                 lambda: sample_next(torch.zeros(1, 4), **args),
                 lambda: generate(random_model("gpt2"), [[1]], 2, **args)):
        with pytest.raises(ValueError, match=name):
            call()


def test_empty_prompt_and_bad_length_raise():
    model = random_model("gpt2")
    for prompts in ([[]], [[1, 2], []], []):
        with pytest.raises(ValueError, match="prompt"):
            generate(model, prompts, 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, [[1]], 0)


# ----------------------------------------------------------------------------- the nucleus is never empty
ISSUE_PROBS = torch.tensor([0.5, 0.25, 0.125, 0.125])  # issue 12, item 3


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("p", [5e-324, 1e-46, 1e-9, 0.3, 0.45])
def test_top_p_always_keeps_the_most_probable_token(dtype, p):
    """Issue 12 item 3: top_p_filter(log([.5, .25, .125, .125]), 1e-46) kept no token (1e-46 is 0 in
    float32), nor did fp16 logits with top_p 1e-9; the most probable token alone must survive."""
    logits = ISSUE_PROBS.log().to(dtype)[None]
    out = top_p_filter(logits, p)
    assert out.dtype == dtype
    assert torch.isfinite(out).tolist() == [[True, False, False, False]]
    assert out[0, 0] == logits[0, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_top_p_one_keeps_everything_and_ties_keep_one(dtype):
    logits = ISSUE_PROBS.log().to(dtype)[None]
    assert torch.isfinite(top_p_filter(logits, 1.0)).all()
    tied = top_p_filter(torch.zeros(2, 5, dtype=dtype), 1e-46)  # uniform rows: one token each
    assert torch.isfinite(tied).sum(-1).tolist() == [1, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sample_next_with_a_tiny_top_p_is_greedy(dtype):
    """Issue 12 item 3: sample_next(..., top_p=1e-46) raised "probability tensor contains either inf,
    nan or element < 0"; it must return the most probable token (id 0 here, id 2 in the second row)."""
    logits = torch.stack([ISSUE_PROBS.log(), ISSUE_PROBS.log()[[3, 2, 0, 1]]]).to(dtype)  # (2, 4)
    for top_p in (1e-46, 1e-9):
        g = torch.Generator().manual_seed(0)
        assert sample_next(logits, temperature=1.0, top_p=top_p, generator=g).tolist() == [0, 2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324])
def test_a_tiny_temperature_is_greedy_not_nan(dtype, temperature):
    """`generate --temperature 1e-300` (and 1e-38) raised "probability tensor contains either inf, nan
    or element < 0": logits / T overflowed float32 (1e-300 is 0 there). T → 0 is greedy: the argmax."""
    logits = torch.stack([ISSUE_PROBS.log() * 900, ISSUE_PROBS.log()[[3, 2, 0, 1]] * 900]).to(dtype)  # (2, 4)
    for top_k, top_p in ((None, None), (2, None), (None, 0.9)):
        g = torch.Generator().manual_seed(0)
        assert sample_next(logits, temperature, top_k, top_p, generator=g).tolist() == [0, 2]


def test_an_ordinary_temperature_scales_the_logits_as_before():
    """The overflow path is taken only on overflow: at T = 0.7 the draw is the same as from
    softmax(logits / 0.7) (seeded), so a seed gives the tokens it gave before."""
    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 4
    for seed in range(5):
        got = sample_next(logits, 0.7, generator=torch.Generator().manual_seed(seed))
        want = torch.multinomial((logits / 0.7).softmax(-1), 1, generator=torch.Generator().manual_seed(seed))
        assert got.tolist() == want.squeeze(-1).tolist()
