"""BERT end to end: masked-LM pretraining, fine-tuning a sentence classifier (SST-2), loading a trained
model, evaluating it and classifying text."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch

from attnlab.models.bert import BertConfig

from attnlab.tasks.text_classification import TextClassificationDataConfig

from attnlab.train.config import TrainConfig
from attnlab.data.classification import SST2_LABELS, read_sst2
from attnlab.data.wordpiece import encode_sentences, pretraining_sentences, train_wordpiece
from attnlab.models.bert import Bert
from attnlab.runs import check_model_dir, fit, read_run_config, run_settings, start_run_dir
from attnlab.train.bert_tasks import MaskedLMTask, SentenceClassificationTask
from attnlab.train.checkpoint import load_weights

log = logging.getLogger("attnlab")


def _load_tokenizer(path: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    tok.no_padding()
    tok.no_truncation()
    return tok


def _initial_model(recipe, train_cfg: TrainConfig, data_cfg: TextClassificationDataConfig):
    """(model, tokenizer, tokenizer.json source or None) for a new run, from train_cfg.init."""
    init = train_cfg.init
    if init in (None, "none"):
        log.info("training a %d-token WordPiece tokenizer", data_cfg.tokenizer_vocab_size)
        tok = train_wordpiece(pretraining_sentences(), data_cfg.tokenizer_vocab_size)
        ids = {t: tok.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")}
        cfg = BertConfig.from_dict({**recipe.model.to_dict(), "vocab_size": tok.get_vocab_size(), "pad_id": ids["[PAD]"],
                                    "cls_id": ids["[CLS]"], "sep_id": ids["[SEP]"], "mask_id": ids["[MASK]"]})
        torch.manual_seed(train_cfg.seed)
        return Bert(cfg), tok, None
    path = Path(init)
    from attnlab.pretrained import NAMED

    if init not in NAMED and not path.exists():
        raise FileNotFoundError(f"init={init}: no such run or model; train it first (e.g. attnlab train --recipe "
                                f"bert-mlm --out {init}), or --set init=all-minilm-l6-v2 | none")
    if path.is_dir() and (path / "config.json").is_file() and read_run_config(path).get("model_type") == "bert":
        model, tok, _ = load_bert_run(path)  # one of our runs, e.g. runs/bert-mlm
        source = path / "tokenizer.json"
    else:
        from attnlab.pretrained import load_encoder

        loaded = load_encoder(init)  # a named model (all-minilm-l6-v2) or a HF BERT directory
        model, tok, source = loaded.model, loaded.tokenizer, loaded.source / "tokenizer.json"
    cfg = BertConfig.from_dict({**model.cfg.to_dict(), "n_labels": recipe.model.n_labels,
                                "dropout": recipe.model.dropout, "attention_dropout": recipe.model.attention_dropout})
    fresh = Bert(cfg)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("classifier.")}
    fresh.load_state_dict({**fresh.state_dict(), **state})
    log.info("initialised from %s", init)
    return fresh, tok, source


def _saved_configs(path: Path) -> tuple[dict, BertConfig, TextClassificationDataConfig, dict]:
    saved = read_run_config(path, "bert")
    return (saved, BertConfig.from_dict(saved["model"]), TextClassificationDataConfig.from_dict(saved["data"]),
            saved["train"])


def train_bert(recipe, out: str | Path, resume: bool = False) -> dict:
    """Train a BERT recipe (masked-LM pretraining or SST-2 classification) into run directory `out`.

    Returns:
        the final validation record with "best", "best_step", "parameters", "steps".
    Raises:
        FileExistsError / FileNotFoundError: for an unusable `out` (runs.check_out_dir) or init.
        ValueError: for an invalid setting.
    """
    out = Path(out)
    _, cfg, data_cfg, train_cfg = run_settings(out, recipe, resume, _saved_configs)
    if resume:
        model, tok = Bert(cfg), _load_tokenizer(out / "tokenizer.json")
    else:
        model, tok, tok_source = _initial_model(recipe, train_cfg, data_cfg)
        cfg = model.cfg
    max_len = min(data_cfg.max_len, cfg.max_seq_len)
    dev, dev_labels = read_sst2("dev")
    if data_cfg.objective == "mlm":
        task = MaskedLMTask(encode_sentences(tok, pretraining_sentences(), max_len), encode_sentences(tok, dev, max_len),
                            cfg, data_cfg.batch_size, data_cfg.mlm_probability, train_cfg.seed, train_cfg.label_smoothing)
    else:
        sentences, labels = read_sst2("train")
        n = data_cfg.n_train or len(sentences)
        task = SentenceClassificationTask((encode_sentences(tok, sentences[:n], max_len), labels[:n]),
                                          (encode_sentences(tok, dev, max_len), dev_labels), cfg.pad_id,
                                          data_cfg.batch_size, train_cfg.seed, train_cfg.label_smoothing)
    if not resume:
        start_run_dir(out, {"model_type": "bert", "recipe": recipe.name, "labels": SST2_LABELS,
                            "model": cfg.to_dict(), "data": data_cfg.to_dict(), "train": train_cfg.to_dict()})
        if tok_source is not None:
            shutil.copyfile(tok_source, out / "tokenizer.json")
        else:
            tok.save(str(out / "tokenizer.json"))
    log.info("model: %.2fM parameters", model.num_parameters() / 1e6)
    return fit(model, task, train_cfg, out, resume, rate_key="sentences_per_s")


def load_bert_run(path: str | Path) -> tuple[Bert, object, dict]:
    """(model in eval mode, WordPiece tokenizer, saved config) of a trained BERT run directory."""
    path = Path(path)
    check_model_dir(path)
    saved = read_run_config(path, "bert")
    model = Bert(BertConfig.from_dict(saved["model"]))
    load_weights(model, path / "model.safetensors")
    return model.eval(), _load_tokenizer(path / "tokenizer.json"), saved


def evaluate_bert(path: str | Path, split: str = "dev", limit: int | None = None) -> dict:
    """SST-2 accuracy ("dev"; "test"/"val" mean dev: GLUE's test labels are hidden) of a classifier
    run, or masked-LM loss/accuracy on the dev sentences for a pretraining run."""
    if split not in ("train", "dev", "val", "test"):
        raise ValueError(f"unknown split {split!r}; known: train, dev (= val = test for SST-2)")
    model, tok, saved = load_bert_run(path)
    data_cfg = TextClassificationDataConfig.from_dict(saved["data"])
    sentences, labels = read_sst2("train" if split == "train" else "dev")
    sentences, labels = sentences[:limit], labels[:limit]
    ids = encode_sentences(tok, sentences, min(data_cfg.max_len, model.cfg.max_seq_len))
    if data_cfg.objective == "mlm":
        record = MaskedLMTask([], ids, model.cfg, 32, data_cfg.mlm_probability, 0).evaluate(model)
    else:
        record = SentenceClassificationTask(([], []), (ids, labels), model.cfg.pad_id, 32, 0).evaluate(model)
    record.pop("n", None)
    return {"split": "train" if split == "train" else "dev", "n": len(sentences), **record}


@torch.no_grad()
def classify_texts(path: str | Path, texts: list[str]) -> list[tuple[str, float]]:
    """(label, probability) of each text under a trained classifier run."""
    from attnlab.data.classification import pad_batch

    model, tok, saved = load_bert_run(path)
    if saved["data"].get("objective") == "mlm":
        raise ValueError(f"{path} is a masked-LM pretraining run, not a classifier; fine-tune it with the sst2 recipe")
    labels = saved.get("labels") or [str(i) for i in range(model.cfg.n_labels)]
    ids = encode_sentences(tok, texts, model.cfg.max_seq_len, warn=True)
    out = []
    for start in range(0, len(ids), 64):
        batch, attention = pad_batch(ids[start:start + 64], model.cfg.pad_id)
        probs = model.classify(model(batch, attention)).softmax(-1)
        for p in probs:
            k = int(p.argmax())
            out.append((labels[k], round(float(p[k]), 4)))
    return out
