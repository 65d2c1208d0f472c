"""Session fixtures: small trained tokenizers (GPT-2 and GPT-4 patterns) for the tokenizer tests."""
from __future__ import annotations

import pytest

from attnlab.tokenizers import ByteLevelBPE
from tokenizer_corpus import train


@pytest.fixture(scope="session")
def tok_gpt2() -> ByteLevelBPE:
    return train("gpt2")


@pytest.fixture(scope="session")
def tok_gpt4() -> ByteLevelBPE:
    return train("gpt4")
