"""Run directories written before the redesign (tests/fixtures/old_runs, made by the previous layout:
norms inside per-sublayer residual wrappers, task settings in config.json's "train" section) still
load, give the outputs they gave then, evaluate, and resume."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from attnlab.recipes import get_recipe
from attnlab.tasks.registry import evaluate_run, get_task, load_run, task_of_run

OLD = Path(__file__).resolve().parents[1] / "fixtures" / "old_runs"
EXPECTED = json.loads((OLD / "expected.json").read_text())


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_old_language_model_runs_give_the_same_logits(name):
    run = load_run(OLD / name)
    ids = torch.tensor([run.tokenizer.encode(EXPECTED[name]["text"])])
    with torch.no_grad():
        logits = run.model(ids).logits[0, -1]
    torch.testing.assert_close(logits, torch.tensor(EXPECTED[name]["logits_last"]), rtol=0, atol=1e-6)


def test_old_translation_run_gives_the_same_logits_and_its_settings_move_to_the_task():
    run = load_run(OLD / "seq2seq")
    case = EXPECTED["seq2seq"]
    src = torch.tensor([run.tokenizer.encode(case["source"])])
    tgt = torch.tensor([[run.model.cfg.bos_id] + run.tokenizer.encode(case["target_prefix"])])
    with torch.no_grad():
        memory, mask = run.model.encode(src)
        logits = run.model.output_logits(run.model.decode(tgt, memory, mask)[0, -1])
    torch.testing.assert_close(logits, torch.tensor(case["logits_last"]), rtol=0, atol=1e-6)
    saved = json.loads((OLD / "seq2seq" / "config.json").read_text())
    assert "beam_size" in saved["train"] and "beam_size" not in saved["data"]  # the old layout
    assert run.config["data"]["beam_size"] == 4 and run.config["data"]["batch_tokens"] == 3000
    assert "beam_size" not in run.config["train"] and "label_smoothing" not in run.config["train"]


def test_old_bert_and_vit_runs_give_the_same_outputs():
    bert = load_run(OLD / "bert")
    ids = torch.tensor([bert.tokenizer.encode(EXPECTED["bert"]["text"]).ids])
    vit = load_run(OLD / "vit")
    with torch.no_grad():
        torch.testing.assert_close(bert.model.classify(bert.model(ids))[0],
                                   torch.tensor(EXPECTED["bert"]["class_logits"]), rtol=0, atol=1e-6)
        image = torch.linspace(-1, 1, 64).view(1, 1, 8, 8)
        torch.testing.assert_close(vit.model(image)[0], torch.tensor(EXPECTED["vit"]["logits"]), rtol=0, atol=1e-6)
    assert bert.config["data"]["init"] is None and "init" not in bert.config["train"]


def test_old_run_resumes_under_the_new_layout(tiny_shakespeare, tmp_path):
    out = tmp_path / "llama"
    shutil.copytree(OLD / "llama", out)
    task = task_of_run(out)
    assert task is get_task("gpt")
    recipe = get_recipe("shakespeare-char-llama").with_overrides(["max_steps=4", "minutes=none"])
    result = task.train(recipe, out, resume=True)
    assert result["steps"] == 4
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["step"] == 4


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_old_language_model_runs_evaluate(tiny_shakespeare, name):
    record = evaluate_run(OLD / name, limit=200)
    assert record["split"] == "val" and record["n"] == 200 and 0 < record["val_loss"] < 10


def test_old_translation_run_evaluates(tiny_multi30k):
    record = evaluate_run(OLD / "seq2seq", split="val", limit=3, beam=1)
    assert record["split"] == "val" and record["n"] == 3 and 0 <= record["bleu"] <= 100
