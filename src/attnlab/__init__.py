"""attnlab: the Transformer family, readable and complete."""
from attnlab.config import Seq2SeqConfig, TrainConfig, TranslationDataConfig
from attnlab.models.seq2seq import Seq2SeqTransformer

__all__ = ["Seq2SeqConfig", "TrainConfig", "TranslationDataConfig", "Seq2SeqTransformer"]
__version__ = "0.1.0"
