"""Model families."""
from attnlab.models.gpt import GPT, GPTOutput
from attnlab.models.seq2seq import DecodeState, Seq2SeqTransformer

__all__ = ["Seq2SeqTransformer", "DecodeState", "GPT", "GPTOutput"]
