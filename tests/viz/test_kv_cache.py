"""kv-cache: the sizes are those of the caches the model allocates; MHA : GQA : MQA = H : K : 1."""
import pytest

from attnlab.viz import kv_cache
from tests.viz.conftest import tiny_gpt


def test_sizes_match_the_models_own_cache(pair_tokenizer):
    source = tiny_gpt(pair_tokenizer, positions="rope", n_heads=4, n_kv_heads=2)
    model, cfg = source.model, source.model.cfg
    sizes = kv_cache.cache_sizes(cfg.n_layers, cfg.n_heads, cfg.kv_heads, cfg.head_dim, [16, 64])
    mha, gqa, mqa = sizes.values()
    model.setup_kv_cache(1, 64)
    assert gqa[1] == model.kv_cache_bytes()  # the picture's bytes are the model's allocation
    model.clear_kv_cache()
    assert mha[1] == 2 * gqa[1] == 4 * mqa[1] and gqa[0] * 4 == gqa[1]
    assert gqa[1] == cfg.n_layers * 2 * cfg.kv_heads * 64 * cfg.head_dim * 4  # fp32 bytes


def test_timing_and_figure(pair_tokenizer, tmp_path):
    source = tiny_gpt(pair_tokenizer, positions="rope", n_kv_heads=2)
    text = "A man sits on the street in snow. " * 10
    r = kv_cache.kv_cache_timing(source, text, (4, 16, 40))
    assert r.positions == [4, 16, 40] and all(len(v) == 3 and min(v) > 0 for v in r.seconds.values())
    kv_cache.draw_kv_cache(r, tmp_path / "k.png")
    with pytest.raises(ValueError, match="--positions must lie in 2..62"):
        kv_cache.kv_cache_timing(source, text, (4, 100))


def test_needs_a_decoder(tiny_seq2seq):
    with pytest.raises(ValueError, match="needs a decoder: smollm2-135m"):
        kv_cache.kv_cache_timing(tiny_seq2seq, "x")
