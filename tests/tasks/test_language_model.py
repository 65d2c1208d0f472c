import json
import math

import pytest
import torch
from safetensors.torch import load_file

from attnlab.data.text import TokenStream, char_tokenizer, split_text
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.tasks.language_model import LanguageModelObjective, TextDataConfig
from attnlab.tasks.registry import get_task
from attnlab.tokenizers import ByteLevelBPE
from attnlab.train.config import TrainConfig
from attnlab.train.loop import Trainer, learning_rate
from attnlab.train.optim import cosine_lr
from tests.conftest import tiny_lm_recipe, tiny_text

LM = get_task("gpt")

# ----------------------------------------------------------------------------- schedule
def test_learning_rate_cosine_defaults_to_max_steps_and_needs_a_horizon():
    cfg = TrainConfig(lr_schedule="cosine", lr=1e-3, min_lr=0.0, warmup_steps=2, max_steps=12)
    assert learning_rate(cfg, 7, 32) == pytest.approx(0.5e-3 * (1 + math.cos(math.pi * 5 / 11)))
    assert learning_rate(cfg, 12, 32) > 0.0 and learning_rate(cfg, 13, 32) == 0.0  # min_lr after the last step
    with pytest.raises(ValueError, match="lr_decay_steps"):
        learning_rate(TrainConfig(lr_schedule="cosine", warmup_steps=2), 3, 32)


@pytest.mark.parametrize("kwargs,field", [
    (dict(lr=1e-3, min_lr=2e-3), "min_lr"), (dict(grad_accum_steps=0), "grad_accum_steps"),
    (dict(warmup_steps=10, lr_decay_steps=10), "lr_decay_steps"), (dict(lr_schedule="linear"), "lr_schedule"),
])
def test_train_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**kwargs)


@pytest.mark.parametrize("kwargs,field", [
    (dict(block_size=0), "block_size"), (dict(train_fraction=1.0), "train_fraction"), (dict(tokenizer="word"), "tokenizer"),
])
def test_text_data_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TextDataConfig(**kwargs)


# ----------------------------------------------------------------------------- data
def test_split_tokenizer_and_blocks():
    text = tiny_text(20)
    train, val = split_text(text, 0.9)
    assert train + val == text and len(train) == int(len(text) * 0.9)
    tok = char_tokenizer(train)
    assert tok.vocab_size == len(set(train)) and tok.decode(tok.encode(train)) == train
    stream = TokenStream(torch.tensor(tok.encode(train)))
    x, y = stream.blocks(torch.tensor([0, 5]), 8)
    assert x.shape == y.shape == (2, 8) and torch.equal(x[:, 1:], y[:, :-1])
    assert tok.decode(x[1].tolist()) == train[5:13] and tok.decode(y[1].tolist()) == train[6:14]
    pieces = list(stream.sequential_blocks(16, batch_size=4))
    xs = torch.cat([a.flatten() for a, _ in pieces])
    assert torch.equal(xs, stream.ids[:-1])  # every position scored once, in order
    assert sum(b.numel() for _, b in stream.sequential_blocks(16, max_tokens=50)) == 50


# ----------------------------------------------------------------------------- gradient accumulation
def _trainer(tmp_path, accum, name):
    text = tiny_text(30)
    tok = char_tokenizer(text)
    stream = TokenStream(torch.tensor(tok.encode(text)))
    cfg = TrainConfig(lr_schedule="constant", lr=1e-3, warmup_steps=1, grad_accum_steps=accum)
    task = LanguageModelObjective(stream, stream, TextDataConfig(block_size=16, batch_size=8), cfg.seed)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("llama", vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_layers=2,
                                    max_seq_len=16))
    return Trainer(model, task, cfg, tmp_path / name, 32), task


def test_grad_accum_of_half_batches_equals_one_full_batch(tmp_path):
    full, task = _trainer(tmp_path, 1, "full")
    accum, _ = _trainer(tmp_path, 2, "accum")
    offsets = task.batches(0)[0]  # (8,)
    loss_full, n_full = full._train_step([offsets])
    loss_acc, n_acc = accum._train_step([offsets[:4], offsets[4:]])
    assert n_full == n_acc == 8 * 16
    assert loss_acc == pytest.approx(loss_full, abs=1e-5)
    assert full.state.step == accum.state.step == 1
    for (name, a), b in zip(full.model.named_parameters(), accum.model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4, msg=name)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)


# ----------------------------------------------------------------------------- end to end
def test_train_lm_end_to_end(tiny_shakespeare, tmp_path):
    out = tmp_path / "run"
    result = LM.train(tiny_lm_recipe(30), out)
    assert result["steps"] == 30 and result["parameters"] > 0
    for name in ("config.json", "model.safetensors", "tokenizer.json", "metrics.jsonl"):
        assert (out / name).is_file()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "val_loss" in r]
    logged = [r for r in records if "lr" in r]
    assert [r["step"] for r in logged] == [5, 10, 15, 20, 25, 30]
    for r in logged:  # the cosine schedule of the overrides: warm-up 5, decay to 1e-3 after step 30
        assert r["lr"] == pytest.approx(cosine_lr(r["step"], 0.01, 0.001, 5, 30))
    assert [r["step"] for r in evals] == [10, 20, 30]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] < math.log(len(set(tiny_shakespeare)))
    assert result["best"] == min(r["val_loss"] for r in evals)
    assert "bits_per_byte" in evals[0] and evals[0]["perplexity"] == pytest.approx(math.exp(evals[0]["val_loss"]), rel=1e-3)
    train_text, _ = split_text(tiny_shakespeare, 0.9)
    tok = ByteLevelBPE.load(out / "tokenizer.json")
    assert tok.vocab_size == len(set(train_text))
    assert sorted(tok.decode([i]) for i in range(tok.vocab_size)) == sorted(set(train_text))
    saved = json.loads((out / "config.json").read_text())
    assert saved["model_type"] == "gpt" and saved["model"]["vocab_size"] == tok.vocab_size
    run = LM.load(out)
    model, tok2 = run.model, run.tokenizer
    assert not model.training and tok2.vocab_size == tok.vocab_size
    scored = LM.evaluate(out, "val")
    assert scored["split"] == "val" and scored["val_loss"] == pytest.approx(result["best"], abs=1e-4)
    assert scored["n"] == len(tiny_shakespeare) - len(train_text) - 1
    assert scored["perplexity"] == pytest.approx(math.exp(scored["val_loss"]), rel=1e-3)
    assert LM.evaluate(out, "train", limit=40)["n"] == 40
    with pytest.raises(ValueError, match="split"):
        LM.evaluate(out, "dev")


def test_resumed_lm_run_equals_uninterrupted(tiny_shakespeare, tmp_path):
    LM.train(tiny_lm_recipe(30), tmp_path / "full")
    LM.train(tiny_lm_recipe(20), tmp_path / "split")
    result = LM.train(tiny_lm_recipe(30), tmp_path / "split", resume=True)
    assert result["steps"] == 30
    a = load_file(str(tmp_path / "full" / "checkpoint" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "checkpoint" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_block_size_longer_than_context_is_refused_before_writing(tiny_shakespeare, tmp_path):
    with pytest.raises(ValueError, match="block_size"):
        LM.train(tiny_lm_recipe(5, ["block_size=32"]), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
