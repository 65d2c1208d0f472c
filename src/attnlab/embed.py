"""Sentence embeddings from a BERT encoder: tokenize (WordPiece), encode, mean-pool, normalise.

Shape legend: B sentences, S tokens, D model dim.
"""
from __future__ import annotations

import logging

import torch

from attnlab.errors import UserError
from attnlab.models.bert import mean_pool
from attnlab.tasks.kinds import Kind

log = logging.getLogger("attnlab")


@torch.no_grad()
def embed(loaded, texts: list[str], batch_size: int = 32) -> torch.Tensor:
    """L2-normalised mean-pooled embeddings of `texts`, as sentence-transformers computes them for
    all-MiniLM-L6-v2 (its model card: mean pooling, then normalisation).

    Args:
        loaded: a tasks.LoadedModel of an encoder (Kind.ENCODER: BERT). texts: sentences; one longer than the model's
            max_seq_len tokens is truncated with a warning.
    Returns:
        (B, D) float32, each row of unit norm.
    Raises:
        UserError: for an empty list or a model that is not an encoder.
    """
    if loaded.kind is not Kind.ENCODER:
        raise UserError(f"{loaded.path} is {loaded.task.described}; embed needs an encoder (e.g. all-minilm-l6-v2)")
    if not texts:
        raise UserError("no text to embed")
    out = []
    for start in range(0, len(texts), batch_size):
        chunk = texts[start:start + batch_size]
        ids = []
        for i, enc in enumerate(loaded.tokenizer.encode_batch(chunk)):
            tokens = enc.ids
            if len(tokens) > loaded.max_seq_len:
                log.warning("text %d has %d tokens; truncated to max_seq_len=%d", start + i + 1, len(tokens),
                            loaded.max_seq_len)
                tokens = tokens[:loaded.max_seq_len - 1] + tokens[-1:]  # keep the final [SEP]
            ids.append(tokens)
        width = max(map(len, ids))
        input_ids = torch.full((len(ids), width), loaded.model.cfg.pad_id, dtype=torch.long)
        mask = torch.zeros(len(ids), width, dtype=torch.long)
        for i, t in enumerate(ids):
            input_ids[i, :len(t)] = torch.tensor(t)
            mask[i, :len(t)] = 1
        out.append(mean_pool(loaded.model(input_ids, mask), mask))
    return torch.cat(out)
