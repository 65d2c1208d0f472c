"""The Mamba family through the task registry: the recipe trains (tiny), evaluates, generates the same
text with and without its recurrent state, converts to a MambaForCausalLM directory and back."""
import json

import pytest
import torch

from attnlab.cli import main
from attnlab.load import load_causal_lm
from attnlab.recipes import get_recipe
from attnlab.tasks.registry import get_task, task_of_recipe

TINY_MAMBA = ["d_model=32", "n_layers=2", "d_state=4", "max_seq_len=16", "block_size=16", "batch_size=8",
              "lr=0.01", "warmup_steps=2", "lr_decay_steps=12", "max_steps=12", "eval_every=6",
              "checkpoint_every=6", "log_every=3"]


def test_the_recipe_matches_shakespeare_char_in_size_and_budget():
    mamba, gpt = get_recipe("shakespeare-char-mamba"), get_recipe("shakespeare-char")
    assert task_of_recipe(mamba) is get_task("mamba") and mamba.model_type == "mamba"
    assert (mamba.data, mamba.train.max_steps) == (gpt.data, gpt.train.max_steps)
    sizes = [get_task(r.model_type).build_model(type(r.model).from_dict({**r.model.to_dict(), "vocab_size": 65}))
             .num_parameters() for r in (mamba, gpt)]
    assert abs(sizes[0] / sizes[1] - 1) < 0.05  # same parameter count ± 5%


def test_train_evaluate_generate_convert(tiny_shakespeare, tmp_path, capsys):
    out = tmp_path / "run"
    sets = [x for s in TINY_MAMBA for x in ("--set", s)]
    assert main(["train", "--recipe", "shakespeare-char-mamba", "--out", str(out), *sets]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["steps"] == 12 and json.loads((out / "config.json").read_text())["model_type"] == "mamba"
    assert main(["evaluate", "--model", str(out)]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored["val_loss"] == pytest.approx(result["best"], abs=1e-4)
    greedy = ["generate", "--model", str(out), "--prompt", "To be", "--max-new-tokens", "40", "--temperature", "0"]
    assert main(greedy) == 0
    cached = capsys.readouterr().out
    assert main(greedy + ["--no-cache"]) == 0
    assert capsys.readouterr().out == cached and len(cached) == len("To be") + 40 + 1  # past max_seq_len 16
    assert main(["convert", "--from", str(out), "--to", str(tmp_path / "hf")]) == 0
    assert json.loads(capsys.readouterr().out)["architecture"] == "MambaForCausalLM"
    ours, exported = load_causal_lm(str(out)), load_causal_lm(str(tmp_path / "hf"))
    ids = torch.tensor([ours.tokenizer.encode("To be or not")])
    with torch.no_grad():
        torch.testing.assert_close(exported.model(ids).logits, ours.model(ids).logits, rtol=0, atol=1e-6)
