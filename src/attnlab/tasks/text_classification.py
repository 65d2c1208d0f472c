"""BERT: masked-LM pretraining and sentence classification (SST-2) — the data config, the two
objectives, and the task (train from scratch or from a run or pretrained encoder, load, evaluate,
classify text).

Shape legend: B sentences, S tokens, V vocabulary, C classes.
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

import torch
import torch.nn.functional as F

from attnlab.config import Config, check, check_literals
from attnlab.data.classification import SST2_LABELS, pad_batch, read_sst2
from attnlab.data.mlm import IGNORE, mask_tokens
from attnlab.data.wordpiece import (encode_sentences, load_wordpiece, pretraining_sentences, train_wordpiece,
                                    wordpiece_from_json)
from attnlab.files import atomic_write
from attnlab.interop.hf_bert import load_hf_bert, save_bert_hf
from attnlab.models.bert import Bert, BertConfig
from attnlab.pretrained import NAMED
from attnlab.seeding import mix_seed
from attnlab.tasks.base import Prepared, Run, RunSpec, Task
from attnlab.train import distributed
from attnlab.train.guards import activation_bytes
from attnlab.train.losses import perplexity
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


def _batches(lengths: list[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Seeded shuffled batches, sorted by length inside groups of 50 batches (less padding)."""
    g = torch.Generator().manual_seed(mix_seed(seed, epoch))
    order = torch.randperm(len(lengths), generator=g).tolist()
    group = batch_size * 50
    batches = []
    for start in range(0, len(order), group):
        chunk = sorted(order[start:start + group], key=lambda i: lengths[i])
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    perm = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in perm]


class MaskedLMObjective:
    """Masked-LM pretraining (BERT §3.1): cross-entropy of the original token at the chosen positions.

    Args:
        train, val: token id lists ([CLS] ... [SEP]). cfg: the BertConfig (pad/cls/sep/mask ids, V).
        batch_size, probability, seed: batching and masking. label_smoothing: of the loss.
    """

    best_metric = "mlm_loss"
    higher_is_better = False
    leaves_parameters_unused = True  # the classifier (DDP must look for unused parameters)

    def __init__(self, train, val, cfg: BertConfig, batch_size: int, probability: float, seed: int,
                 label_smoothing: float = 0.0):
        self.train, self.val, self.cfg = train, val, cfg
        self.batch_size, self.probability, self.seed = batch_size, probability, seed
        self.label_smoothing = label_smoothing
        special = torch.tensor([cfg.pad_id, cfg.cls_id, cfg.sep_id, cfg.mask_id])
        ordinary = torch.ones(cfg.vocab_size, dtype=torch.bool)
        ordinary[special] = False
        self.special, self.ordinary = special, ordinary.nonzero().flatten()

    def batches(self, epoch: int) -> list[tuple[int, int, list[int]]]:
        return [(epoch, i, b) for i, b in enumerate(_batches([len(x) for x in self.train], self.batch_size,
                                                             self.seed, epoch))]

    def _masked(self, rows: list[list[int]], generator: torch.Generator):
        ids, attention = pad_batch(rows, self.cfg.pad_id)
        eligible = attention.bool() & ~torch.isin(ids, self.special)
        inputs, labels = mask_tokens(ids, eligible, self.cfg.mask_id, self.cfg.vocab_size, self.probability,
                                     generator, self.ordinary)
        return inputs, attention, labels

    def batch_rows(self, batch) -> int:
        return len(batch[2])

    def shard(self, batch, rows: range) -> tuple:
        """The sentences `rows` of a batch (a process's part of it, data/sharding.py): the whole
        batch is masked as in one process, then these rows are kept."""
        return (*batch[:3], rows)

    def loss(self, model: Bert, batch) -> tuple[torch.Tensor, int]:
        """batch: (epoch, position, sentence indices[, rows kept after masking the whole batch])."""
        epoch, position, index = batch[:3]
        g = torch.Generator().manual_seed(mix_seed(self.seed, epoch, position))
        inputs, attention, labels = self._masked([self.train[i] for i in index], g)
        if len(batch) > 3:
            keep = slice(batch[3].start, batch[3].stop)
            inputs, attention, labels = inputs[keep], attention[keep], labels[keep]
        chosen = labels != IGNORE
        logits = model.mlm_logits(model(inputs, attention)[chosen])  # the head only where a token is predicted
        loss = F.cross_entropy(logits.float(), labels[chosen], label_smoothing=self.label_smoothing)
        return loss, int(chosen.sum())

    @torch.no_grad()
    def evaluate(self, model: Bert) -> dict:
        """{"mlm_loss", "mlm_perplexity", "mlm_accuracy", "n"} on the validation sentences, masked with
        a fixed seed."""
        g = torch.Generator().manual_seed(12345)
        total, correct, count = 0.0, 0, 0
        for start in range(0, len(self.val), 128):
            inputs, attention, labels = self._masked(self.val[start:start + 128], g)
            chosen = labels != IGNORE
            logits = model.mlm_logits(model(inputs, attention)[chosen]).float()
            total += F.cross_entropy(logits, labels[chosen], reduction="sum").item()
            correct += int((logits.argmax(-1) == labels[chosen]).sum())
            count += int(chosen.sum())
        loss = total / max(count, 1)
        return {"mlm_loss": round(loss, 4), "mlm_perplexity": round(perplexity(loss), 2),
                "mlm_accuracy": round(correct / max(count, 1), 4), "n": count}


class SentenceClassificationObjective:
    """Fine-tuning for sentence classification (BERT §4.1): cross-entropy of the classifier on the
    pooled [CLS] state; validation accuracy on the held-out split.

    Args:
        train, val: (token id lists, labels). pad_id: padding id. batch_size, seed, label_smoothing.
    """

    best_metric = "accuracy"
    leaves_parameters_unused = True  # the masked-LM head (DDP must look for unused parameters)

    def __init__(self, train, val, pad_id: int, batch_size: int, seed: int, label_smoothing: float = 0.0):
        self.train, self.val, self.pad_id = train, val, pad_id
        self.batch_size, self.seed, self.label_smoothing = batch_size, seed, label_smoothing

    def batches(self, epoch: int) -> list[list[int]]:
        return _batches([len(x) for x in self.train[0]], self.batch_size, self.seed, epoch)

    def batch_rows(self, index: list[int]) -> int:
        return len(index)

    def shard(self, index: list[int], rows: range) -> list[int]:
        """The sentences `rows` of a batch (a process's part of it, data/sharding.py)."""
        return index[rows.start:rows.stop]

    def loss(self, model: Bert, index: list[int]) -> tuple[torch.Tensor, int]:
        ids, attention = pad_batch([self.train[0][i] for i in index], self.pad_id)
        labels = torch.tensor([self.train[1][i] for i in index])
        logits = model.classify(model(ids, attention))
        return F.cross_entropy(logits.float(), labels, label_smoothing=self.label_smoothing), len(index)

    @torch.no_grad()
    def evaluate(self, model: Bert) -> dict:
        """{"accuracy", "val_loss", "n"} on the validation sentences."""
        total, correct = 0.0, 0
        ids_all, labels_all = self.val
        for start in range(0, len(ids_all), 128):
            ids, attention = pad_batch(ids_all[start:start + 128], self.pad_id)
            labels = torch.tensor(labels_all[start:start + 128])
            logits = model.classify(model(ids, attention)).float()
            total += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += int((logits.argmax(-1) == labels).sum())
        n = len(ids_all)
        return {"accuracy": round(correct / n, 4), "val_loss": round(total / n, 4), "n": n}


class BertTask(Task):
    """BERT runs ("bert"): masked-LM pretraining, or SST-2 classification fine-tuned from a run, a
    pretrained encoder (all-minilm-l6-v2, a HF BERT directory) or from scratch."""

    model_type, model_class, model_config, data_config = "bert", Bert, BertConfig, TextClassificationDataConfig
    rate_key = "sentences_per_s"

    def load_tokenizer(self, path: Path):
        return load_wordpiece(path / "tokenizer.json")

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

    def evaluate_run(self, run: Run, split: str | None, limit: int | None) -> dict:
        """SST-2 accuracy ("dev"; "test"/"val" mean dev: GLUE's test labels are hidden) of a classifier
        run, or masked-LM loss/accuracy on the dev sentences for a pretraining run."""
        split = split or "dev"
        if split not in ("train", "dev", "val", "test"):
            raise ValueError(f"unknown split {split!r}; known: train, dev (= val = test for SST-2)")
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
    def classify(self, run: Run, inputs: list[str]) -> list[tuple[str, float]]:
        """(label, probability) of each text under a trained classifier run."""
        model = run.model
        if run.config["data"].get("objective") == "mlm":
            raise ValueError(f"{run.path} is a masked-LM pretraining run, not a classifier; fine-tune it with the "
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
