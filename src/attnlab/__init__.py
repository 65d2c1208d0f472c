"""attnlab: the Transformer family, readable and complete.

Layout (dependencies point down; no import cycles, checked by tests/test_imports.py):
    cli/          the `attnlab` command: one module per group of sub-commands, validators in args.py
    convert.py    any loadable model -> a Hugging Face directory or a GGUF file (what the task allows)
    load.py       any model by name or path: pretrained names, .gguf, HF directories, our run directories
    tasks/        one module per task family (translation, language_model, text_classification, vision):
                  data config, objective, evaluation, loading a run; base.py the shared skeleton and
                  what a family states about itself, kinds.py the kinds of model, loaded.py LoadedModel
                  (the one loaded-model type), registry.py the one map from a run's model_type to its
                  task: the only vocabulary of kinds
    recipes/      one small file per recipe (model config + data config + TrainConfig); recipe.py: Recipe
    chat.py, embed.py, textstream.py   chat templates, sentence embeddings, streamed decoding
    generate.py, sampling.py           greedy / beam search / KV-cache generation, the sampling chain
    train/        objective.py (the Objective protocol), loop.py (one loop), end_of_run.py, guards.py, config.py (TrainConfig), optim.py,
                  losses.py, checkpoint.py, state.py (TrainState), run_dir.py (what a run
                  directory holds, its lock)
    interop/      HF directories (GPT family, BERT) and GGUF in; HF out; safetensors directories
    models/       one file per family with its config: seq2seq, gpt, bert, vit, mamba; base.py: Model and
                  the CausalLM protocol (what generate needs)
    nn/           building blocks with plain-int arguments: attention, blocks (TransformerLayer),
                  positional, rope, norm, mlp, moe, kv_cache, masks, linear
    tokenizers/   byte-level BPE (train / encode / decode), pre-tokenizer patterns, tokenizer.json, GGUF
    data/         one module per data kind; datasets.py: where each real data set lives
    errors.py     UserError: bad input (one line and exit 2 on the command line); anything else is a bug
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
