"""attnlab: the Transformer family, readable and complete."""
from attnlab.config import GPTConfig, Seq2SeqConfig, TextDataConfig, TrainConfig, TranslationDataConfig
from attnlab.models.gpt import GPT
from attnlab.models.seq2seq import Seq2SeqTransformer

__all__ = ["GPTConfig", "Seq2SeqConfig", "TextDataConfig", "TrainConfig", "TranslationDataConfig", "GPT",
           "Seq2SeqTransformer"]
__version__ = "0.1.0"
