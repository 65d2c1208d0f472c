"""attnlab: the Transformer family, readable and complete."""
from attnlab.models.gpt import GPTConfig
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.tasks.language_model import TextDataConfig
from attnlab.train.config import TrainConfig
from attnlab.tasks.translation import TranslationDataConfig
from attnlab.models.gpt import GPT
from attnlab.models.seq2seq import Seq2SeqTransformer

__all__ = ["GPTConfig", "Seq2SeqConfig", "TextDataConfig", "TrainConfig", "TranslationDataConfig", "GPT",
           "Seq2SeqTransformer"]
__version__ = "0.1.0"
