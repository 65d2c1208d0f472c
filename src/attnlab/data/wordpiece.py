"""WordPiece tokenizers for the BERT recipes, built with the `tokenizers` package (WordPiece is
BERT's subword model, not BPE; we use the well-kept implementation rather than our own).

Also the English text the bert-mlm recipe pretrains on.
"""
from __future__ import annotations

import logging
from pathlib import Path

from attnlab.data.classification import read_sst2
from attnlab.data.datasets import find_dataset
from attnlab.data.text import read_text, split_text
from attnlab.data.translation import read_lines
from attnlab.errors import UserError

log = logging.getLogger("attnlab")
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def pretraining_sentences() -> list[str]:
    """English sentences without labels: SST-2's training sentences, Multi30k's English training
    captions and Tiny Shakespeare's first 90% (the LM recipes' training split), one line each."""
    sst2, _ = read_sst2("train")
    multi30k = read_lines(find_dataset("multi30k", ["train.en"]) / "train.en")
    shakespeare = [line for line in split_text(read_text("tinyshakespeare"), 0.9)[0].splitlines() if line.strip()]
    return sst2 + multi30k + shakespeare


def train_wordpiece(sentences: list[str], vocab_size: int):
    """A lower-casing BERT WordPiece tokenizer trained on `sentences`: [PAD] 0, [UNK] 1, [CLS] 2,
    [SEP] 3, [MASK] 4; encodings come as [CLS] ... [SEP].

    Source: Devlin et al. 2019, §3 (WordPiece, 30,000 tokens; [CLS] first, [SEP] last).
    """
    # optional dependency (the hf and dev extras): only the BERT recipes need WordPiece
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(sentences, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIALS))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


def wordpiece_from_json(text: str):
    """A tokenizer.json's text as a tokenizers.Tokenizer (rank 0's tokenizer, sent to the other
    processes of a distributed run)."""
    # optional dependency (the hf and dev extras): only the BERT models need WordPiece
    from tokenizers import Tokenizer

    return Tokenizer.from_str(text)


def load_wordpiece(path: str | Path):
    """A WordPiece tokenizer.json (ours or a HF BERT's) as a tokenizers.Tokenizer that neither pads nor
    truncates (callers cut to max_len themselves, keeping [SEP]).

    Raises:
        FileNotFoundError: naming the file. ValueError: naming the file when it cannot be read.
    """
    # optional dependency (the hf and dev extras): only the BERT models need WordPiece
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer at {path}")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises its own exception type for a malformed file
        raise UserError(f"{path} is not a readable tokenizer.json ({e})") from None
    tok.no_padding()
    tok.no_truncation()
    return tok


def encode_sentences(tokenizer, sentences: list[str], max_len: int, warn: bool = False) -> list[list[int]]:
    """Token ids ([CLS] ... [SEP]) of each sentence, cut to max_len keeping the final [SEP]."""
    out = []
    for i, enc in enumerate(tokenizer.encode_batch(sentences)):
        ids = enc.ids
        if len(ids) > max_len:
            if warn:
                log.warning("text %d has %d tokens; truncated to max_seq_len=%d", i + 1, len(ids), max_len)
            ids = ids[:max_len - 1] + ids[-1:]
        out.append(ids)
    return out
