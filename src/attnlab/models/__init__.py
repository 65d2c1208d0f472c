"""Model families."""
from attnlab.models.seq2seq import DecodeState, Seq2SeqTransformer

__all__ = ["Seq2SeqTransformer", "DecodeState"]
