"""Tiny configs and tiny data shared by the tests."""
from __future__ import annotations

import random

import pytest
import torch

from attnlab.models.seq2seq import Seq2SeqConfig

EN = "a man woman dog cat runs sits on the street in snow red blue big small two".split()
DE = "ein mann frau hund katze läuft sitzt auf der straße im schnee rot blau groß klein zwei".split()


def tiny_config(**overrides) -> Seq2SeqConfig:
    base = dict(vocab_size=40, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64,
                dropout=0.0, max_seq_len=64)
    return Seq2SeqConfig(**{**base, **overrides})


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    random.seed(0)


def make_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Word-for-word 'translations' over a 16-word lexicon: learnable by a tiny model."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        idx = [rng.randrange(len(EN)) for _ in range(rng.randint(2, 6))]
        pairs.append((" ".join(EN[i] for i in idx).capitalize() + ".", " ".join(DE[i] for i in idx).capitalize() + "."))
    return pairs


@pytest.fixture
def tiny_multi30k(tmp_path, monkeypatch):
    """A miniature Multi30k folder (train/val/test_2016_flickr, en/de) found through $ATTNLAB_DATA."""
    root = tmp_path / "data"
    folder = root / "multi30k"
    folder.mkdir(parents=True)
    for split, n, seed in (("train", 200, 0), ("val", 20, 1), ("test_2016_flickr", 20, 2)):
        pairs = make_pairs(n, seed)
        (folder / f"{split}.en").write_text("".join(e + "\n" for e, _ in pairs), encoding="utf-8")
        (folder / f"{split}.de").write_text("".join(d + "\n" for _, d in pairs), encoding="utf-8")
    monkeypatch.setenv("ATTNLAB_DATA", str(root))
    return folder
