"""BERT recipes end to end on tiny data: masked-LM pretraining, SST-2 fine-tuning from it, evaluation,
classification and the CLI."""
import json
import random

import pytest
import torch

from attnlab.cli import main
from attnlab.recipes import get_recipe
from attnlab.tasks.registry import get_task

BERT = get_task("bert")


def load_bert_run(path):
    run = BERT.load(path)
    return run.model, run.tokenizer, run.config

POS = "good great wonderful lovely fine superb".split()
NEG = "bad awful terrible boring poor dull".split()
TINY = ["d_model=32", "n_heads=4", "n_layers=2", "d_ff=64", "max_seq_len=32", "tokenizer_vocab_size=120",
        "batch_size=16", "eval_every=10", "checkpoint_every=10", "warmup_steps=2", "dropout=0.0",
        "attention_dropout=0.0"]


def sentence(rng, label):
    words = [rng.choice(POS if label else NEG)] + [rng.choice("the a film movie plot was is".split()) for _ in range(3)]
    rng.shuffle(words)
    return " ".join(words)


@pytest.fixture
def tiny_text_data(tmp_path, monkeypatch):
    rng = random.Random(0)
    root = tmp_path / "data"
    for name in ("sst2", "multi30k", "tinyshakespeare"):
        (root / name).mkdir(parents=True)
    for split, n in (("train", 300), ("dev", 60)):
        rows = [(sentence(rng, i % 2), i % 2) for i in range(n)]
        (root / "sst2" / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s} \t{y}\n" for s, y in rows))
    (root / "multi30k" / "train.en").write_text("".join(f"a dog runs in the {w} snow.\n" for w in POS + NEG))
    (root / "tinyshakespeare" / "input.txt").write_text("ROMEO:\nA good night, a bad day.\n" * 30)
    monkeypatch.setenv("ATTNLAB_DATA", str(root))
    monkeypatch.setattr("attnlab.data.datasets.search_path", lambda: [root])
    return root


def test_mlm_pretraining_then_sst2_fine_tuning(tiny_text_data, tmp_path):
    mlm = get_recipe("bert-mlm").with_overrides(TINY + ["max_steps=30", "lr=3e-3", "min_lr=1e-4"])
    record = BERT.train(mlm, tmp_path / "mlm")
    curve = [json.loads(x)["mlm_loss"] for x in (tmp_path / "mlm" / "metrics.jsonl").read_text().splitlines()
             if "mlm_loss" in x]
    assert curve[-1] < curve[0]
    model, tok, saved = load_bert_run(tmp_path / "mlm")
    assert saved["model"]["mask_id"] == tok.token_to_id("[MASK]") and record["steps"] == 30

    sst2 = get_recipe("sst2").with_overrides(TINY + ["max_steps=150", "lr=2e-3", "eval_every=25", f"init={tmp_path / 'mlm'}"])
    fine = BERT.train(sst2, tmp_path / "sst2")
    assert fine["best"] >= 0.9  # one sentiment word per sentence: learnable
    pretrained = load_bert_run(tmp_path / "mlm")[0].state_dict()["layers.0.self_attn.q_proj.weight"]
    assert (pretrained != load_bert_run(tmp_path / "sst2")[0].state_dict()["layers.0.self_attn.q_proj.weight"]).any()
    assert BERT.evaluate(tmp_path / "sst2", "dev")["accuracy"] == pytest.approx(fine["best"], abs=1e-4)
    labels = BERT.classify(BERT.load(tmp_path / "sst2"), ["a wonderful film", "an awful movie"])
    assert [label for label, _ in labels] == ["positive", "negative"] and all(0.5 < p <= 1 for _, p in labels)


def test_padding_does_not_change_the_classification(tiny_text_data, tmp_path):
    sst2 = get_recipe("sst2").with_overrides(TINY + ["max_steps=5", "init=none"])
    BERT.train(sst2, tmp_path / "run")
    model, tok, _ = load_bert_run(tmp_path / "run")
    ids = tok.encode("the film was good").ids
    alone = model.classify(model(torch.tensor([ids])))
    other = tok.encode("a bad dull boring movie was the plot the end").ids
    width = max(len(ids) + 5, len(other))
    padded = torch.tensor([ids + [0] * (width - len(ids)), other + [0] * (width - len(other))])
    with torch.no_grad():
        batch = model.classify(model(padded, (padded != 0).long()))
    torch.testing.assert_close(batch[0], alone[0].detach(), atol=1e-5, rtol=1e-5)


def test_cli_train_evaluate_classify_and_errors(tiny_text_data, tmp_path, capsys, caplog):
    sets = [x for s in TINY + ["init=none"] for x in ("--set", s)]
    assert main(["train", "--recipe", "sst2", "--steps", "10", "--out", str(tmp_path / "r"), *sets]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--model", str(tmp_path / "r")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["split"] == "dev" and result["n"] == 60 and 0 <= result["accuracy"] <= 1
    assert main(["classify", "--model", str(tmp_path / "r"), "a good film", "a bad film " * 40]) == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert len(lines) == 2 and all(line.split("\t")[0] in ("positive", "negative") for line in lines)
    assert "truncated to max_seq_len=32" in caplog.text
    assert main(["train", "--recipe", "sst2", "--out", str(tmp_path / "x"), "--set", "init=/no/such/run"]) == 2
    assert "/no/such/run" in capsys.readouterr().err
