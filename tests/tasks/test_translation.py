"""Checkpoints: save -> load gives identical outputs; interrupted + resumed == uninterrupted."""
import json

import pytest
import torch
from safetensors.torch import load_file

from attnlab.tasks.registry import get_task
from attnlab.tasks.translation import TranslationObjective
from tests.conftest import tiny_recipe

TRANSLATION = get_task("seq2seq")


def load_translator(path):
    run = TRANSLATION.load(path)
    return run.model, run.tokenizer, run.config


def test_resumed_run_equals_uninterrupted(tiny_multi30k, tmp_path):
    TRANSLATION.train(tiny_recipe(7), tmp_path / "full")
    TRANSLATION.train(tiny_recipe(3), tmp_path / "split")
    TRANSLATION.train(tiny_recipe(7), tmp_path / "split", resume=True)
    a = load_file(str(tmp_path / "full" / "checkpoint" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "checkpoint" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    state = json.loads((tmp_path / "split" / "checkpoint" / "state.json").read_text())
    assert state["step"] == 7


def test_saved_model_loads_with_identical_outputs(tiny_multi30k, tmp_path):
    result = TRANSLATION.train(tiny_recipe(4), tmp_path / "run")
    assert {"val_bleu", "val_loss", "best", "tokens_per_s"} <= set(result)
    model, tok, saved = load_translator(tmp_path / "run")
    again, _, _ = load_translator(tmp_path / "run")
    src = torch.tensor([tok.encode("A man runs on the street.")])
    tgt = torch.tensor([[saved["model"]["bos_id"]] + tok.encode("Ein Mann")])
    torch.testing.assert_close(model(src, tgt), again(src, tgt), rtol=0, atol=0)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("loss" in x and "lr" in x and "tokens_per_s" in x for x in lines)
    assert any("val_bleu" in x for x in lines)


def test_ctrl_c_checkpoints_after_the_step_and_resume_matches(tiny_multi30k, tmp_path, monkeypatch):
    import os
    import signal

    from attnlab.train.loop import Trainer

    TRANSLATION.train(tiny_recipe(7), tmp_path / "full")
    original = Trainer._train_step

    def step_then_ctrl_c(self, batch):
        out = original(self, batch)
        if self.state.step == 3:
            os.kill(os.getpid(), signal.SIGINT)  # arrives as if typed during step 3
        return out

    monkeypatch.setattr(Trainer, "_train_step", step_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        TRANSLATION.train(tiny_recipe(7), tmp_path / "split")
    state = json.loads((tmp_path / "split" / "checkpoint" / "state.json").read_text())
    assert state["step"] == 3
    monkeypatch.setattr(Trainer, "_train_step", original)
    TRANSLATION.train(tiny_recipe(7), tmp_path / "split", resume=True)
    a = load_file(str(tmp_path / "full" / "checkpoint" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "checkpoint" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_diverged_loss_stops_without_touching_the_weights(tiny_multi30k, tmp_path, monkeypatch):
    original = TranslationObjective.loss
    calls = []

    def nan_at_third(self, model, batch):
        loss, n = original(self, model, batch)
        calls.append(1)
        return (loss * float("nan"), n) if len(calls) == 3 else (loss, n)

    monkeypatch.setattr(TranslationObjective, "loss", nan_at_third)
    with pytest.raises(FloatingPointError, match="at step 3"):
        TRANSLATION.train(tiny_recipe(7), tmp_path / "run")
    state = json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())
    assert state["step"] == 2  # the checkpoint of step 2 (checkpoint_every=2) is intact
    weights = load_file(str(tmp_path / "run" / "checkpoint" / "model.safetensors"))
    assert all(torch.isfinite(w).all() for w in weights.values())


@pytest.mark.parametrize("metric,pick", [("val_loss", min), ("val_bleu", max)])
def test_the_kept_weights_are_the_best_by_best_metric(tiny_multi30k, tmp_path, metric, pick):
    out = tmp_path / metric
    result = TRANSLATION.train(tiny_recipe(12, [f"best_metric={metric}", "average_last=0"]), out)
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if "val_bleu" in r]
    assert [r["step"] for r in evals] == [4, 8, 12]
    best = pick(evals, key=lambda r: r[metric])  # the first of equals, as the loop keeps the first
    assert (result["best"], result["best_step"]) == (best[metric], best["step"])
    objective_metric = json.loads((out / "config.json").read_text())["data"]["best_metric"]
    assert objective_metric == metric


def test_best_metric_names_the_allowed_values():
    with pytest.raises(ValueError, match="best_metric.*val_bleu.*val_loss"):
        tiny_recipe(1, ["best_metric=bleu"])
