"""Encoding/decoding: round-trips, special tokens, merge application, errors."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenizer_corpus import SPECIALS, STRESS, TEXTS, train


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_roundtrip_any_text(tok_gpt2, tok_gpt4, text):
    for tok in (tok_gpt2, tok_gpt4):
        for allowed in ("none", "all"):
            assert tok.decode(tok.encode(text, allowed)) == text


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=8), st.sampled_from(SPECIALS))))
def test_roundtrip_with_specials(tok_gpt2, parts):
    text = "".join(parts)
    assert tok_gpt2.decode(tok_gpt2.encode(text, "all")) == text
    assert tok_gpt2.decode(tok_gpt2.encode(text)) == text


@pytest.mark.parametrize("text", [STRESS, "", " ", "\r\n", "\x00\x00", "  \t\t\n\n  ",
                                  "\U0001F469\u200d\U0001F467",
                                  "e\u0301\u0301\u0301", "مرحبا", "中文" * 50, " " * 1000])
def test_roundtrip_stress(tok_gpt2, tok_gpt4, text):
    for tok in (tok_gpt2, tok_gpt4):
        assert tok.decode(tok.encode(text)) == text


def test_training_text_compresses(tok_gpt2):
    text = TEXTS[0]
    assert len(tok_gpt2.encode(text)) < len(text.encode("utf-8")) / 2


def test_specials_allowed_whole_units(tok_gpt2):
    t = tok_gpt2
    pad, bos, eos, dot = (t.token_to_id(s) for s in SPECIALS)
    ids = t.encode("<bos>Hello<eos><pad><pad>", "all")
    assert ids[0] == bos and ids[-3:] == [eos, pad, pad]
    assert ids[1:-3] == t.encode("Hello")
    ids = t.encode("word<eos>word", allowed_special={"<eos>"})
    assert ids == t.encode("word") + [eos] + t.encode("word")
    assert t.encode("a <|a.b|> b", "all") == t.encode("a ") + [dot] + t.encode(" b")


def test_specials_not_allowed_are_plain_text(tok_gpt2):
    t = tok_gpt2
    specials = set(t.special_tokens.values())
    for text in ["<bos>Hello<eos>", "x<|a.b|>y", "<eos><eos>"]:
        ids = t.encode(text)
        assert not specials & set(ids)
        assert t.decode(ids) == text
    ids = t.encode("<bos><eos>", allowed_special={"<eos>"})
    assert t.token_to_id("<eos>") in ids and t.token_to_id("<bos>") not in ids


def test_special_with_regex_metacharacters_matched_literally(tok_gpt2):
    t = tok_gpt2
    dot = t.token_to_id("<|a.b|>")
    assert dot in t.encode("<|a.b|>", "all")
    assert dot not in t.encode("<|axb|>", "all")  # "." is not a wildcard
    assert dot not in t.encode("<|a", "all") + t.encode("b|>", "all")


def test_longest_special_wins():
    from attnlab.tokenizers import ByteLevelBPE
    tok = ByteLevelBPE.train(["x"], 300, ["<s>", "<s><s>"])
    assert tok.encode("<s><s><s>", "all") == [1, 0]


def test_decode_skip_special_and_replacement(tok_gpt2):
    t = tok_gpt2
    ids = t.encode("<bos>Grüße<eos>", "all")
    assert t.decode(ids) == "<bos>Grüße<eos>"
    assert t.decode(ids, skip_special=True) == "Grüße"
    ue = t.encode("ü")  # two bytes; a cut character decodes to U+FFFD
    assert t.decode([t.token_to_id("Ã")]) == "\ufffd"
    assert t.decode(ue) == "ü"


def test_encode_batch_equals_encode(tok_gpt4):
    texts = TEXTS[:5] + ["<eos> x"]
    assert tok_gpt4.encode_batch(texts, "all") == [tok_gpt4.encode(s, "all") for s in texts]


def test_same_pretoken_same_ids_cache_consistent():
    tok = train("gpt2", 400)
    first = tok.encode(STRESS)
    tok._cache.clear()
    assert tok.encode(STRESS) == first == tok.encode(STRESS)


def test_errors(tok_gpt2):
    t = tok_gpt2
    with pytest.raises(ValueError, match="unknown special"):
        t.encode("x", allowed_special={"<nope>"})
    with pytest.raises(ValueError, match="allowed_special"):
        t.encode("x", allowed_special="some")
    with pytest.raises(ValueError, match="not in the vocabulary"):
        t.decode([t.vocab_size])
    with pytest.raises(ValueError, match="not in the vocabulary"):
        t.decode([-1])
    with pytest.raises(KeyError, match="not in the vocabulary"):
        t.token_to_id("no-such-token-here")
    with pytest.raises(KeyError, match="not in the vocabulary"):
        t.id_to_token(10**6)


def test_vocab_lookups(tok_gpt2):
    t = tok_gpt2
    for i in range(t.vocab_size):
        assert t.token_to_id(t.id_to_token(i)) == i
    assert t.pattern == "gpt2"
    assert t.id_to_token(t.encode(" ")[0]) == "Ġ"
