"""Pre-tokenization regexes and the GPT-2 byte <-> unicode alphabet."""
from __future__ import annotations

import pytest

from attnlab.tokenizers import pretokenize
from attnlab.tokenizers.pretokenize import (bytes_to_unicode, token_to_unicode,
                                            unicode_to_token)


def test_gpt2_space_handling():
    assert pretokenize("a  b") == ["a", " ", " b"]
    assert pretokenize("Hello world!!  ") == ["Hello", " world", "!!", "  "]


def test_gpt2_contractions_digits_symbols():
    assert pretokenize("I'm don't 2024 ok") == ["I", "'m", " don", "'t", " 2024", " ok"]
    assert pretokenize("DON'T") == ["DON", "'", "T"]  # GPT-2 contractions are case-sensitive


def test_gpt4_pattern():
    assert pretokenize("DON'T 12345 a", "gpt4") == ["DON", "'T", " ", "123", "45", " a"]
    assert pretokenize("x\n\n  y", "gpt4") == ["x", "\n\n", " ", " y"]
    assert pretokenize("(hello)", "gpt4") == ["(hello", ")"]


def test_pieces_concatenate_to_input():
    text = "Grüße 😀 中文\r\n\t x\x00 'S"
    for pattern in ("gpt2", "gpt4"):
        assert "".join(pretokenize(text, pattern)) == text


def test_unknown_pattern():
    with pytest.raises(ValueError, match="gpt2"):
        pretokenize("x", "bert")


def test_byte_alphabet_is_gpt2s():
    table = bytes_to_unicode()
    assert len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("A")] == "A"
    assert table[0] == "Ā" and table[255] == "ÿ"
    assert token_to_unicode(" é".encode()) == "ĠÃ©"
    assert unicode_to_token("ĠÃ©") == " é".encode()
    with pytest.raises(ValueError, match="byte-level alphabet"):
        unicode_to_token("€")
