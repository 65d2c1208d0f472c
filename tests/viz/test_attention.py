"""attention: rows are distributions, causal models see no future, the reported heads are the argmax,
and the hooks leave the model as it was."""
import numpy as np
import pytest
import torch

from attnlab.viz import attention
from attnlab.viz.capture import attention_modules, recorded_attention
from tests.viz.conftest import tiny_gpt

TEXT = attention.EXAMPLE


@pytest.fixture(scope="module")
def minilm_maps(minilm):
    return attention.attention_maps(minilm, TEXT)


def test_encoder_rows_sum_to_one_and_see_both_sides(minilm_maps):
    w = minilm_maps.weights
    assert w.shape == (6, 12, 16, 16)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    assert (w >= 0).all()
    assert w[:, :, 3, 10:].sum() > 0  # an encoder's token attends to later tokens too


@pytest.mark.parametrize("preset", ["gpt2", "llama", "mistral"])
def test_causal_model_gives_zero_weight_to_the_future(pair_tokenizer, preset):
    source = tiny_gpt(pair_tokenizer, **({} if preset == "gpt2" else {"positions": "rope", "n_kv_heads": 2}),
                      **({"sliding_window": 3} if preset == "mistral" else {}))
    maps = attention.attention_maps(source, "A man sits on the street in snow.")
    w = maps.weights
    t = w.shape[-1]
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    future = np.triu(np.ones((t, t), bool), k=1)
    assert (w[:, :, future] == 0).all()
    if preset == "mistral":  # and nothing older than the window
        far = np.tril(np.ones((t, t), bool), k=-3)
        assert (w[:, :, far] == 0).all()


def test_top_heads_are_the_argmax_of_the_returned_weights(minilm_maps):
    index = attention.find_token(minilm_maps.query_tokens, "it")
    assert index == 10
    heads = attention.top_heads(minilm_maps, index)
    assert [h["position"] for h in heads] == [j for j in range(16) if j not in (0, 10, 15)]  # not itself, [CLS], [SEP]
    for h in heads:
        column = minilm_maps.weights[:, :, index, h["position"]]
        assert column[h["layer"], h["head"]] == pytest.approx(column.max())
        assert h["weight"] == pytest.approx(float(column.max()), abs=1e-4)
    layer, head = attention.head_for(minilm_maps, index, 2)
    assert minilm_maps.weights[layer, head, index, 2] == minilm_maps.weights[:, :, index, 2].max()


def test_unknown_token_lists_the_tokens(minilm_maps):
    with pytest.raises(ValueError, match=r"'banana' is not a token of the text; its tokens are: .*'animal'"):
        attention.find_token(minilm_maps.query_tokens, "banana")


def test_cross_attention_of_a_translation_model(tiny_seq2seq):
    maps = attention.attention_maps(tiny_seq2seq, "A dog runs in the snow.", cross=True, target="Ein hund läuft.")
    n_tgt = len(tiny_seq2seq.tokenizer.encode("Ein hund läuft."))
    n_src = len(tiny_seq2seq.tokenizer.encode("A dog runs in the snow."))
    assert maps.weights.shape == (2, 4, n_tgt + 1, n_src) and maps.query_tokens[-1] == "<eos>"
    np.testing.assert_allclose(maps.weights.sum(-1), 1.0, atol=1e-5)


def test_cross_on_an_encoder_names_the_models_that_fit(minilm):
    with pytest.raises(ValueError, match="--cross needs an encoder–decoder model: a translation run"):
        attention.attention_maps(minilm, TEXT, cross=True)


def test_hooks_change_nothing_and_are_removed(tiny_seq2seq):
    model = tiny_seq2seq.model
    src = torch.tensor([[5, 6, 7, 8]])
    before = model.encode(src)[0]
    modules = attention_modules(model, "self")
    assert len(modules) == 2 and len(attention_modules(model, "cross")) == 2
    with recorded_attention(modules) as records:
        during = model.encode(src)[0]
    torch.testing.assert_close(during, before, atol=1e-5, rtol=1e-5)
    assert all(r.shape == (1, 4, 4, 4) for r in records)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in modules)


def test_drawing_writes_a_png(minilm_maps, tmp_path):
    out = tmp_path / "a.png"
    attention.draw_attention(minilm_maps, 10, 3, 1, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
