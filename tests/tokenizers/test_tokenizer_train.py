"""Training: known answers, tie-break, order independence, incremental == naive recount."""
from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.tokenizers import ByteLevelBPE, pretokenize
from attnlab.tokenizers.pretokenize import unicode_to_token
from tokenizer_corpus import TEXTS


def naive_merges(texts, n_merges, min_frequency=2, pattern="gpt2"):
    """Reference trainer: recount every pair over every word before each merge.

    Same rules as the incremental trainer: overlapping pairs count separately, highest count
    wins, ties go to the smallest (left bytes, right bytes), a pair whose concatenation is
    already a token is dropped, merges replace non-overlapping occurrences left to right.
    Returns (merges as (left bytes, right bytes) pairs, set of dropped pairs).
    """
    counts = Counter(p for t in texts for p in pretokenize(t, pattern))
    words = [([bytes([b]) for b in p.encode("utf-8")], c) for p, c in counts.items()]
    known, dropped, merges = {bytes([b]) for b in range(256)}, set(), []
    while len(merges) < n_merges:
        pairs = Counter()
        for w, c in words:
            for pair in zip(w, w[1:]):
                if pair not in dropped:
                    pairs[pair] += c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p[0], p[1]))
        if pairs[best] < min_frequency:
            break
        if best[0] + best[1] in known:
            dropped.add(best)
            continue
        known.add(best[0] + best[1])
        merges.append(best)
        new_words = []
        for w, c in words:
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words.append((out, c))
        words = new_words
    return merges, dropped


def learned(tok: ByteLevelBPE) -> list[tuple[bytes, bytes]]:
    """The merges of a trained tokenizer as (left bytes, right bytes)."""
    return [(unicode_to_token(a), unicode_to_token(b)) for a, b in tok.merges]


def test_classic_aaabdaaabac_known_answer():
    # Pairs: aa=4 (overlaps count), ab=2 -> merge (a, a). Then (aa, a)=2 ties (a, b)=2 and
    # b"a" < b"aa" -> (a, b). Then (aa, ab)=2. All remaining pairs occur once.
    tok = ByteLevelBPE.train(["aaabdaaabac"], 1000)
    assert learned(tok) == [(b"a", b"a"), (b"a", b"b"), (b"aa", b"ab")]
    tok = ByteLevelBPE.train(["aaabdaaabac"], 1000, min_frequency=1)
    assert learned(tok) == [(b"a", b"a"), (b"a", b"b"), (b"aa", b"ab"), (b"a", b"c"),
                            (b"aaab", b"ac"), (b"aaab", b"d"), (b"aaabd", b"aaabac")]
    assert tok.encode("aaabdaaabac") == [tok.token_to_id("aaabdaaabac")]
    assert tok.encode("aaab") == [tok.token_to_id("aaab")]


def test_id_layout_specials_then_bytes_then_merges():
    tok = ByteLevelBPE.train(["hello hello hello"], 300, ["<pad>", "<bos>", "<eos>"])
    assert tok.special_tokens == {"<pad>": 0, "<bos>": 1, "<eos>": 2}
    assert [tok.token_to_id(t) for t in ["<pad>", "<bos>", "<eos>"]] == [0, 1, 2]
    assert tok.id_to_token(3) == "Ā" and tok.encode("\x00") == [3]  # byte 0 -> id 3
    assert tok.encode("A") == [3 + ord("A")]
    assert tok.id_to_token(259) == tok.merges[0][0] + tok.merges[0][1]
    assert tok.vocab_size == 259 + len(tok.merges) <= 300


def test_vocab_size_limit_and_min_frequency_stop():
    tok = ByteLevelBPE.train(["ab ab ab cd"], 258)
    assert tok.vocab_size == 258 and len(tok.merges) == 2
    tok = ByteLevelBPE.train(["ab ab cd"], 10_000, min_frequency=2)
    assert learned(tok) == [(b"a", b"b")]  # pre-tokens "ab", " ab", " cd": the rest occur once


def test_vocab_size_too_small_names_minimum():
    with pytest.raises(ValueError, match="minimum is 259"):
        ByteLevelBPE.train(["abc"], 258, ["<pad>", "<bos>", "<eos>"])
    ByteLevelBPE.train(["abc"], 259, ["<pad>", "<bos>", "<eos>"])  # exactly the minimum is fine


def test_bad_arguments():
    with pytest.raises(ValueError, match="pattern must be one of"):
        ByteLevelBPE.train(["abc"], 300, pattern="gpt3")
    with pytest.raises(ValueError, match="distinct"):
        ByteLevelBPE.train(["abc"], 300, ["<s>", "<s>"])


def test_special_tokens_in_training_text_are_not_learned():
    tok = ByteLevelBPE.train(["<eos><eos><eos> x<eos>y"] * 5, 400, ["<eos>"])
    assert learned(tok) == [(b" ", b"x")]  # what is left: " x" x5, "y" x5


def test_permuted_corpus_learns_same_merges():
    shuffled = list(TEXTS)
    random.Random(0).shuffle(shuffled)
    for pattern in ("gpt2", "gpt4"):
        a = ByteLevelBPE.train(TEXTS, 500, pattern=pattern, min_frequency=1)
        b = ByteLevelBPE.train(reversed(shuffled), 500, pattern=pattern, min_frequency=1)
        assert a.merges == b.merges


@pytest.mark.parametrize("texts", [
    ["aaabdaaabac"],
    ["aaaa aaaa aaa", "abababab baba"],
    ["low low low low low lower lower newest newest newest newest newest newest widest widest"],
    ["Zwei junge weiße Männer, Grüße! 😀😀😀 中文中文 a\tb\t\tc\n\n"],
])
@pytest.mark.parametrize("pattern", ["gpt2", "gpt4"])
def test_incremental_equals_naive_recount(texts, pattern):
    tok = ByteLevelBPE.train(texts, 400, pattern=pattern, min_frequency=1)
    assert learned(tok) == naive_merges(texts, 400 - 256, 1, pattern)[0]


def test_incremental_equals_naive_on_shared_corpus():
    tok = ByteLevelBPE.train(TEXTS, 420, min_frequency=2)
    assert learned(tok) == naive_merges(TEXTS, 420 - 256, 2)[0]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="ab c\n'1é", max_size=25), max_size=6),
       st.integers(1, 3))
def test_incremental_equals_naive_property(texts, min_frequency):
    tok = ByteLevelBPE.train(texts, 300, min_frequency=min_frequency)
    assert learned(tok) == naive_merges(texts, 300 - 256, min_frequency)[0]
