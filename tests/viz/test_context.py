"""context: the word's vectors are identical at the embedding layer when its token id and position
are the same, and the layers then pull them apart."""
import pytest

from attnlab.viz import context


def test_cosine_is_one_at_the_embedding_layer_for_the_same_id_and_position(minilm):
    r = context.context_similarity(minilm, "bank", ("The bank of the river.", "The bank was closed today."))
    assert r.positions == (2, 2)
    assert r.layers == ["token", "embeddings", "1", "2", "3", "4", "5", "6"]
    assert r.cosine[0] == pytest.approx(1.0, abs=1e-6) and r.cosine[1] == pytest.approx(1.0, abs=1e-6)
    assert r.cosine[-1] < 0.99  # the context changes it


def test_default_sentences(minilm, tmp_path):
    r = context.context_similarity(minilm)
    assert r.positions == (2, 6)  # a different position: only the token row is identical
    assert r.cosine[0] == pytest.approx(1.0, abs=1e-6) and r.cosine[1] < 1.0
    assert r.probe_cosine.shape == (2, 4) and sorted(r.nearest(0)) == sorted(context.PROBES)
    context.draw_context(r, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_word_not_in_a_sentence_lists_its_tokens(minilm):
    message = "--word 'bank' is not a token of the text; its tokens are: '\\[CLS\\]' 'a' 'river'"
    with pytest.raises(ValueError, match=message):
        context.context_similarity(minilm, "bank", ("A river.", "The bank."))


def test_needs_an_encoder(tiny_seq2seq):
    with pytest.raises(ValueError, match="needs an encoder: all-minilm-l6-v2"):
        context.context_similarity(tiny_seq2seq)
