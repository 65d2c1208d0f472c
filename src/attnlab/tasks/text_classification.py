"""BERT runs: the data config and the task (train from scratch or from a run or pretrained encoder,
load, evaluate, classify text, export). Its two objectives: masked-LM pretraining (masked_lm.py) and
sentence classification on SST-2 (sentence_classification.py).
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

import torch

from attnlab.config import Config, check, check_literals
from attnlab.data.classification import SST2_LABELS, pad_batch, read_sst2
from attnlab.data.wordpiece import (encode_sentences, load_wordpiece, pretraining_sentences, train_wordpiece,
                                    wordpiece_from_json)
from attnlab.errors import UserError
from attnlab.files import atomic_write
from attnlab.interop.hf_bert import load_hf_bert, save_bert_hf
from attnlab.models.bert import Bert, BertConfig
from attnlab.pretrained import NAMED
from attnlab.tasks.base import Prepared, RunSpec, Task
from attnlab.tasks.kinds import Kind
from attnlab.tasks.loaded import LoadedModel
from attnlab.tasks.masked_lm import MaskedLMObjective
from attnlab.tasks.sentence_classification import SentenceClassificationObjective
from attnlab.train import distributed
from attnlab.train.guards import activation_bytes
from attnlab.train.run_dir import is_run_dir

log = logging.getLogger("attnlab")


@dataclass
class TextClassificationDataConfig(Config):
    """Which sentences a text-classification (or masked-LM) recipe trains on, how it tokenizes and
    batches them, the loss's label smoothing, and the weights it starts from."""

    objective: Literal["classification", "mlm"] = "classification"  # fine-tune a classifier, or pretrain (MLM)
    dataset: Literal["sst2"] = "sst2"  # labelled sentences (data/datasets.py); dev is the evaluation split
    tokenizer_vocab_size: int = 8000  # WordPiece vocabulary trained from the text (models from scratch)
    max_len: int = 64                 # longer sentences are truncated (with a warning at inference)
    batch_size: int = 32              # sentences per batch
    mlm_probability: float = 0.15     # masked-LM pretraining: share of eligible tokens chosen (BERT §3.1)
    n_train: Optional[int] = None     # use only the first N training sentences (None = all)
    label_smoothing: float = 0.0      # ε_ls of the loss (BERT fine-tuning uses none)
    init: Optional[str] = None        # start from these weights: one of our BERT runs, a HF BERT directory
                                      # or a pretrained name (all-minilm-l6-v2); None or "none" = random

    def __post_init__(self):
        check_literals(self)
        check(self.tokenizer_vocab_size >= 100, "tokenizer_vocab_size", ">= 100", self.tokenizer_vocab_size)
        for name in ("max_len", "batch_size"):
            check(getattr(self, name) >= 2, name, ">= 2", getattr(self, name))
        check(0.0 < self.mlm_probability < 1.0, "mlm_probability", "in (0, 1)", self.mlm_probability)
        check(0.0 <= self.label_smoothing < 1.0, "label_smoothing", "in [0, 1)", self.label_smoothing)
        check(self.n_train is None or self.n_train >= 1, "n_train", "None or >= 1", self.n_train)


class BertTask(Task):
    """BERT runs ("bert"): masked-LM pretraining, or SST-2 classification fine-tuned from a run, a
    pretrained encoder (all-minilm-l6-v2, a HF BERT directory) or from scratch."""

    model_type, model_class, model_config, data_config = "bert", Bert, BertConfig, TextClassificationDataConfig
    kind, classifies, servable, exports_hf = Kind.ENCODER, True, True, True
    hf_model_types = ("bert",)
    rate_key = "sentences_per_s"

    def load_tokenizer(self, path: Path):
        return load_wordpiece(path / "tokenizer.json")

    def load(self, path: str | Path) -> LoadedModel:
        loaded = super().load(path)
        loaded.max_seq_len = loaded.model.cfg.max_seq_len
        return loaded

    def load_hf(self, path: Path) -> LoadedModel:
        """A HF BERT directory (interop/hf_bert.py), with its WordPiece tokenizer and the longest input
        its sentence-transformers pooling config allows."""
        model, tokenizer, _, limit = load_hf_bert(str(path))
        return LoadedModel(model, tokenizer, self, Path(path), max_seq_len=limit)

    def export_hf(self, model: Bert, tokenizer, out: Path, tokenizer_file: Path | None = None) -> None:
        """A HF BERT directory (interop/hf_bert.py), with the WordPiece tokenizer.json copied."""
        save_bert_hf(model, out, tokenizer_file)

    def _initial(self, spec: RunSpec) -> tuple[BertConfig, object, Path | None, dict | None]:
        """(model config, tokenizer, tokenizer.json to copy or None, weights without the classifier or
        None) of a new run, from data_cfg.init."""
        init, recipe_cfg = spec.data_cfg.init, spec.model_cfg
        if init in (None, "none"):
            log.info("training a %d-token WordPiece tokenizer", spec.data_cfg.tokenizer_vocab_size)
            world = distributed.current_world()
            tok = train_wordpiece(pretraining_sentences(), spec.data_cfg.tokenizer_vocab_size) if world.is_main else None
            if world.distributed:  # HF's WordPiece training is not deterministic: all take rank 0's vocabulary
                tok = wordpiece_from_json(distributed.from_main(tok.to_str() if tok is not None else None))
            ids = {t: tok.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")}
            cfg = BertConfig.from_dict({**recipe_cfg.to_dict(), "vocab_size": tok.get_vocab_size(),
                                        "pad_id": ids["[PAD]"], "cls_id": ids["[CLS]"], "sep_id": ids["[SEP]"],
                                        "mask_id": ids["[MASK]"]})
            return cfg, tok, None, None
        path = Path(init)
        if init not in NAMED and not path.exists():
            raise FileNotFoundError(f"init={init}: no such run or model; train it first (e.g. attnlab train --recipe "
                                    f"bert-mlm --out {init}), or --set init=all-minilm-l6-v2 | none")
        if path.is_dir() and is_run_dir(path):  # one of our runs, e.g. runs/bert-mlm
            run = self.load(path)
            model, tok, source = run.model, run.tokenizer, path / "tokenizer.json"
        else:  # a named model (all-minilm-l6-v2) or a HF BERT directory
            model, tok, source, _ = load_hf_bert(init)
        cfg = BertConfig.from_dict({**model.cfg.to_dict(), "n_labels": recipe_cfg.n_labels,
                                    "dropout": recipe_cfg.dropout, "attention_dropout": recipe_cfg.attention_dropout})
        state = {k: v for k, v in model.state_dict().items() if not k.startswith("classifier.")}
        log.info("initialised from %s", init)
        return cfg, tok, source, state

    def batch_memory(self, model_cfg: BertConfig, data_cfg: TextClassificationDataConfig) -> tuple[str, int, int]:
        tokens = data_cfg.batch_size * data_cfg.max_len
        return "batch_size", tokens, activation_bytes(tokens, model_cfg.d_model, model_cfg.n_layers)

    def prepare(self, spec: RunSpec) -> Prepared:
        data_cfg, seed = spec.data_cfg, spec.train_cfg.seed
        if spec.resume:
            cfg, tok, source, state = spec.model_cfg, self.load_tokenizer(spec.out), None, None
        else:
            cfg, tok, source, state = self._initial(spec)
        max_len = min(data_cfg.max_len, cfg.max_seq_len)
        dev, dev_labels = read_sst2("dev")
        if data_cfg.objective == "mlm":
            objective = MaskedLMObjective(encode_sentences(tok, pretraining_sentences(), max_len),
                                          encode_sentences(tok, dev, max_len), cfg, data_cfg.batch_size,
                                          data_cfg.mlm_probability, seed, data_cfg.label_smoothing)
        else:
            sentences, labels = read_sst2("train")
            n = data_cfg.n_train or len(sentences)
            objective = SentenceClassificationObjective((encode_sentences(tok, sentences[:n], max_len), labels[:n]),
                                                        (encode_sentences(tok, dev, max_len), dev_labels), cfg.pad_id,
                                                        data_cfg.batch_size, seed, data_cfg.label_smoothing)

        def save_files(out: Path) -> None:
            if source is not None:
                atomic_write(out / "tokenizer.json", lambda tmp: shutil.copyfile(source, tmp))
            else:
                atomic_write(out / "tokenizer.json", lambda tmp: tok.save(str(tmp)))

        return Prepared(cfg, objective, save_files, run_info={"labels": SST2_LABELS}, init_state=state)

    def evaluate_run(self, run: LoadedModel, split: str | None, limit: int | None) -> dict:
        """SST-2 accuracy ("dev"; "test"/"val" mean dev: GLUE's test labels are hidden) of a classifier
        run, or masked-LM loss/accuracy on the dev sentences for a pretraining run."""
        split = split or "dev"
        if split not in ("train", "dev", "val", "test"):
            raise UserError(f"unknown split {split!r}; known: train, dev (= val = test for SST-2)")
        data_cfg = TextClassificationDataConfig.from_dict(run.config["data"])
        model = run.model
        sentences, labels = read_sst2("train" if split == "train" else "dev")
        sentences, labels = sentences[:limit], labels[:limit]
        ids = encode_sentences(run.tokenizer, sentences, min(data_cfg.max_len, model.cfg.max_seq_len))
        if data_cfg.objective == "mlm":
            record = MaskedLMObjective([], ids, model.cfg, 32, data_cfg.mlm_probability, 0).evaluate(model)
        else:
            record = SentenceClassificationObjective(([], []), (ids, labels), model.cfg.pad_id, 32, 0).evaluate(model)
        record.pop("n", None)
        return {"split": "train" if split == "train" else "dev", "n": len(sentences), **record}

    @torch.no_grad()
    def classify(self, run: LoadedModel, inputs: list[str]) -> list[tuple[str, float]]:
        """(label, probability) of each text under a trained classifier run."""
        model = run.model
        if run.config["data"].get("objective") == "mlm":
            raise UserError(f"{run.path} is a masked-LM pretraining run, not a classifier; fine-tune it with the "
                            f"sst2 recipe")
        labels = run.config.get("labels") or [str(i) for i in range(model.cfg.n_labels)]
        ids = encode_sentences(run.tokenizer, inputs, model.cfg.max_seq_len, warn=True)
        out = []
        for start in range(0, len(ids), 64):
            batch, attention = pad_batch(ids[start:start + 64], model.cfg.pad_id)
            probs = model.classify(model(batch, attention)).softmax(-1)
            for p in probs:
                k = int(p.argmax())
                out.append((labels[k], round(float(p[k]), 4)))
        return out
