"""tokenizer.json: save/load round-trip, parity with the HF `tokenizers` library, file errors."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.tokenizers import ByteLevelBPE, load_tokenizer
from attnlab.tokenizers.pretokenize import unicode_to_token
from tokenizer_corpus import CORPUS, SPECIALS, STRESS, TEXTS

# Characters from long-standing Unicode blocks: the `regex` module and HF's Oniguruma may
# disagree on \p{L}/\p{N} for characters assigned only in recent Unicode versions.
SAFE_ALPHABET = st.characters(codec="utf-8", exclude_categories=("Cs", "Cn", "Co"),
                              max_codepoint=0x33FF) | st.sampled_from(
    list("中文字符日本語한국어😀🎉👍🏽🇩🇪\U0001F600\u200d\ufeff\uff01"))


@pytest.fixture(scope="module")
def saved(tok_gpt2, tok_gpt4, tmp_path_factory):
    out = {}
    for tok in (tok_gpt2, tok_gpt4):
        path = tmp_path_factory.mktemp(tok.pattern) / "tokenizer.json"
        tok.save(path)
        out[tok.pattern] = (tok, path)
    return out


@pytest.fixture(scope="module")
def hf_tokenizers(saved):
    tokenizers = pytest.importorskip("tokenizers")
    return {name: (tok, tokenizers.Tokenizer.from_file(str(path)))
            for name, (tok, path) in saved.items()}


def test_save_load_identical(saved):
    for tok, path in saved.values():
        again = load_tokenizer(path)
        assert again.merges == tok.merges and again.special_tokens == tok.special_tokens
        assert again.vocab_size == tok.vocab_size and again.pattern == tok.pattern
        for text in TEXTS + [STRESS, "<bos>" + STRESS + "<eos><|a.b|>"]:
            for allowed in ("none", "all"):
                assert again.encode(text, allowed) == tok.encode(text, allowed)
    assert not [p for p in os.listdir(path.parent) if p != "tokenizer.json"]  # no temp files


def test_save_to_directory_and_file_shape(tok_gpt4, tmp_path):
    tok_gpt4.save(tmp_path)
    data = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    assert data["model"]["type"] == "BPE"
    assert [t["content"] for t in data["added_tokens"]] == SPECIALS
    assert all(t["special"] for t in data["added_tokens"])
    split, byte_level = data["pre_tokenizer"]["pretokenizers"]
    assert split["type"] == "Split" and split["behavior"] == "Isolated"
    assert byte_level == {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": False}
    assert data["decoder"]["type"] == "ByteLevel"
    assert ByteLevelBPE.load(tmp_path).merges == tok_gpt4.merges


def test_hf_loads_our_file_identical_ids(hf_tokenizers):
    for tok, hf in hf_tokenizers.values():
        for text in CORPUS + [STRESS, "<bos>" + STRESS + "<eos>", "x<|a.b|>y<pad><pad>"]:
            ids = tok.encode(text, allowed_special="all")
            assert hf.encode(text).ids == ids
            assert hf.decode(ids, skip_special_tokens=False) == tok.decode(ids)
            assert hf.decode(ids, skip_special_tokens=True) == tok.decode(ids, skip_special=True)
        assert hf.get_vocab_size() == tok.vocab_size


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.text(SAFE_ALPHABET, max_size=12), st.sampled_from(SPECIALS))))
def test_hf_parity_property(hf_tokenizers, parts):
    text = "".join(parts)
    for tok, hf in hf_tokenizers.values():
        assert hf.encode(text).ids == tok.encode(text, allowed_special="all")


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False), st.lists(st.text("abc", max_size=16), max_size=4))
def test_hf_parity_shuffled_merge_order(tmp_path_factory, rnd, texts):
    """Arbitrary merge tables (a token used before it is made, two merges to one token)."""
    tokenizers = pytest.importorskip("tokenizers")
    tokens = [b"a", b"b", b"c"]
    merges = []
    for _ in range(14):
        a, b = rnd.choice(tokens), rnd.choice(tokens)
        if (a, b) not in merges:
            merges.append((a, b))
            if a + b not in tokens:
                tokens.append(a + b)
    rnd.shuffle(merges)
    token_bytes = {i: bytes([i]) for i in range(256)}
    for t in tokens[3:]:
        token_bytes[len(token_bytes)] = t
    ids = {b: i for i, b in token_bytes.items()}
    tok = ByteLevelBPE(token_bytes, [(ids[a], ids[b]) for a, b in merges])
    path = tmp_path_factory.mktemp("shuffled") / "tokenizer.json"
    tok.save(path)
    hf = tokenizers.Tokenizer.from_file(str(path))
    for text in texts:
        assert hf.encode(text).ids == tok.encode(text)


@pytest.mark.parametrize("merges, text, expected", [
    ([(b"ab", b"a"), (b"a", b"b")], "abab", [b"aba", b"b"]),  # (ab, a) outranks the 2nd (a, b)
    ([(b"ab", b"a"), (b"a", b"b")], "ababab", [b"aba", b"b", b"ab"]),
    ([(b"ab", b"ab"), (b"a", b"b")], "ababab", [b"abab", b"ab"]),
    ([(b"a", b"b"), (b"ab", b"ab"), (b"ab", b"a")], "ababab", [b"abab", b"ab"]),
])
def test_merge_order_known_answers(tmp_path, merges, text, expected):
    """A merge that uses a token before the merge making it: HF's (rank, position) order."""
    token_bytes = {i: bytes([i]) for i in range(256)}
    for t in (b"ab", b"aba", b"abab"):
        token_bytes[len(token_bytes)] = t
    ids = {b: i for i, b in token_bytes.items()}
    tok = ByteLevelBPE(token_bytes, [(ids[a], ids[b]) for a, b in merges])
    assert tok.encode(text) == [ids[t] for t in expected]
    tokenizers = pytest.importorskip("tokenizers")
    tok.save(tmp_path)
    assert tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode(text).ids \
        == tok.encode(text)


def test_read_hf_trained_gpt2_style(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers
    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<pad>", "<s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    hf.train_from_iterator(TEXTS, trainer)
    hf.save(str(tmp_path / "tokenizer.json"))
    ours = ByteLevelBPE.load(tmp_path / "tokenizer.json")
    assert ours.pattern == "gpt2" and ours.special_tokens == {"<pad>": 0, "<s>": 1}
    for text in CORPUS + [STRESS, "<s>x<pad>"]:
        assert ours.encode(text, "all") == hf.encode(text).ids
        assert ours.decode(hf.encode(text).ids) == hf.decode(hf.encode(text).ids, False)


def test_read_hf_llama3_style_split_ignore_merges_nfc(tmp_path):
    """Split(regex)+ByteLevel, NFC normalizer and ignore_merges, as in LLaMA-3 / Qwen files."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import Regex, models, normalizers, pre_tokenizers
    from attnlab.tokenizers.pretokenize import GPT4_PATTERN
    vocab = {chr_: i for i, chr_ in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    merges = [("a", "b"), ("b", "c"), ("a", "bc"), ("Ġ", "ab")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    vocab["Ã¼"] = len(vocab)  # "ü": no merge makes it, only ignore_merges reaches it
    hf = tokenizers.Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
    hf.normalizer = normalizers.NFC()
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT4_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.add_special_tokens(["<|begin_of_text|>"])
    hf.save(str(tmp_path / "tokenizer.json"))
    ours = ByteLevelBPE.load(tmp_path / "tokenizer.json")
    assert ours.pattern == "gpt4"
    for text in ["abc ab abcc u\u0308 ü", "<|begin_of_text|>abc", STRESS]:
        assert ours.encode(text, "all") == hf.encode(text).ids
    assert ours.encode("abc") == [vocab["abc"]] and ours.encode("ü") == [vocab["Ã¼"]]


def _multi30k() -> Path | None:
    roots = [os.environ.get("ATTNLAB_DATA"), Path(__file__).parents[3] / "shared" / "data",
             Path.home() / ".cache" / "attnlab"]
    for root in roots:
        if root and (Path(root) / "multi30k" / "train.de").is_file():
            return Path(root) / "multi30k"
    return None


def test_multi30k_parity_with_hf(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    data = _multi30k()
    if data is None:
        pytest.skip("Multi30k not found ($ATTNLAB_DATA, ../shared/data, ~/.cache/attnlab)")
    lines = []
    for lang in ("en", "de"):
        lines += (data / f"train.{lang}").read_text(encoding="utf-8").splitlines()
    tok = ByteLevelBPE.train(lines, 8000, ["<pad>", "<bos>", "<eos>"])
    assert tok.vocab_size == 8000
    tok.save(tmp_path)
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    german = (data / "val.de").read_text(encoding="utf-8").splitlines()
    german = ["<bos>" + line + "<eos>" for line in german] + [STRESS]
    ours = tok.encode_batch(german, allowed_special="all")
    assert [e.ids for e in hf.encode_batch(german)] == ours
    assert [tok.decode(ids) for ids in ours] == german


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_tokenizer(tmp_path / "nope.json")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)  # a directory without tokenizer.json


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["model"].update(type="WordPiece"), "model.type is 'WordPiece', expected 'BPE'"),
    (lambda d: d.pop("model"), "missing 'model'"),
    (lambda d: d["model"]["merges"].insert(0, "Ġ nope"), r"model.merges\[0\]"),
    (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer"),
    (lambda d: d["model"].update(unk_token="<nope>"), "unk_token '<nope>'"),
    (lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False}, {"type": "ByteLevel"}]}),
     "individual_digits"),
    (lambda d: d["model"]["vocab"].update({"€": 99999}), "byte-level alphabet"),
    (lambda d: d.update(normalizer={"type": "Lowercase"}), "normalizer"),
    (lambda d: d["added_tokens"].append({"content": 3}), r"added_tokens\[4\]"),
])
def test_malformed_file(tok_gpt2, tmp_path, edit, message):
    tok_gpt2.save(tmp_path)
    path = tmp_path / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_tokenizer(path)


def test_special_colliding_with_vocab_spelling_cannot_be_saved(tmp_path):
    tok = ByteLevelBPE.train(["x"], 300, ["a"])  # "a" is also the spelling of byte 0x61
    assert tok.encode("a", "all") == [0] and tok.encode("a") == [1 + ord("a")]
    with pytest.raises(ValueError, match="collides"):
        tok.save(tmp_path)


def test_not_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_tokenizer(tmp_path)


def test_vocab_strings_are_byte_level(tok_gpt2, tmp_path):
    tok_gpt2.save(tmp_path)
    vocab = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    for spelling, i in vocab.items():
        if spelling not in SPECIALS:
            assert tok_gpt2.decode([i]) == unicode_to_token(spelling).decode("utf-8", "replace")


@pytest.mark.parametrize("unk, fuse, expected", [
    (None, False, [300, 98]), (256, False, [97, 256, 256, 98, 98]), (256, True, [97, 256, 98, 98])])
def test_vocab_missing_bytes_like_hf(tmp_path, unk, fuse, expected):
    """A vocab lacking some bytes (SmolLM2 lacks 21): such a byte is dropped without an unk
    token (so "a" and "b" around it still merge), else it becomes unk, as in HF's BPE model."""
    token_bytes = {i: bytes([i]) for i in range(256) if i not in (ord("x"), 0xBF)}
    token_bytes[300] = b"ab"
    tok = ByteLevelBPE(token_bytes, [(ord("a"), ord("b"))], [("<unk>", 256, True)],
                       unk_id=unk, fuse_unk=fuse)
    assert tok.encode("axxbb") == expected
    tok.save(tmp_path)
    again = load_tokenizer(tmp_path)
    texts = ["axxbb", "axb xx ÿÿ ¿x", STRESS, "<unk>x"]
    assert [again.encode(t, "all") for t in texts] == [tok.encode(t, "all") for t in texts]
    tokenizers = pytest.importorskip("tokenizers")
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert [hf.encode(t).ids for t in texts] == [tok.encode(t, "all") for t in texts]
