"""attnlab: the Transformer family, readable and complete.

Layout (dependencies point down; no import cycles, checked by tests/test_imports.py):
    cli/          the `attnlab` command: one module per group of sub-commands, validators in args.py
    convert.py    any loadable model -> a Hugging Face directory (dispatches through the task registry)
    load.py       any model by name or path: pretrained names, .gguf, HF directories, our run directories
    tasks/        one module per task family (translation, language_model, text_classification, vision):
                  data config, objective, evaluation, loading a run; base.py the shared skeleton,
                  registry.py the one map from a run's model_type to its task
    recipes/      one small file per recipe (model config + data config + TrainConfig); recipe.py: Recipe
    chat.py, embed.py, textstream.py   chat templates, sentence embeddings, streamed decoding
    generate.py, sampling.py           greedy / beam search / KV-cache generation, the sampling chain
    train/        loop.py (one loop), end_of_run.py, guards.py, config.py (TrainConfig), optim.py,
                  losses.py, checkpoint.py, state.py (the training state), run_dir.py (what a run
                  directory holds, its lock)
    interop/      HF directories (GPT family, BERT) and GGUF in; HF out; safetensors directories
    models/       one file per family with its config: seq2seq, gpt, bert, vit; base.py: Model
    nn/           building blocks with plain-int arguments: attention, blocks (TransformerLayer),
                  positional, rope, norm, mlp, moe, kv_cache, masks, linear
    tokenizers/   byte-level BPE (train / encode / decode), pre-tokenizer patterns, tokenizer.json, GGUF
    data/         one module per data kind; datasets.py: where each real data set lives
    config.py, files.py, jsonfile.py, tensorfile.py, seeding.py, pretrained.py   config base, atomic
                  writes and crash recovery, JSON, validated safetensors files,
                  seed mixing, named pretrained models located on disk
"""
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.tasks.language_model import TextDataConfig
from attnlab.tasks.translation import TranslationDataConfig
from attnlab.train.config import TrainConfig

__all__ = ["GPTConfig", "Seq2SeqConfig", "TextDataConfig", "TrainConfig", "TranslationDataConfig", "GPT",
           "Seq2SeqTransformer"]
__version__ = "0.1.0"
