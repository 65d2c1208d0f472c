"""How a training step runs (train/speed.py, TrainConfig autocast / compile / optimizer_impl): each
choice trains the same model to the same numbers as the fp32 eager reference, within its bound."""
import pytest
import torch
import torch.nn.functional as F

from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn.attention import scaled_dot_product_attention
from attnlab.recipes import get_recipe
from attnlab.nn.cpu_tuning import native_bf16
from attnlab.train.config import TrainConfig
from attnlab.train.loop import Trainer
from attnlab.train.optim import build_optimizer
from attnlab.train.speed import eager


class NextToken:
    """Next-token cross-entropy on fixed (B, T + 1) token rows."""

    best_metric = "val_loss"
    higher_is_better = False

    def __init__(self, rows):
        self.rows = rows

    def loss(self, model, batch):
        x, y = self.rows[batch, :-1], self.rows[batch, 1:]
        return F.cross_entropy(model(x).logits.flatten(0, 1).float(), y.flatten()), y.numel()

    def evaluate(self, model):
        loss, _ = self.loss(model, torch.arange(len(self.rows)))
        return {"val_loss": loss.item()}


def _trainer(tmp_path, name, **fields):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=17, d_model=32, n_heads=4, n_layers=2, max_seq_len=16, dropout=0.0))
    rows = torch.randint(0, 17, (8, 17), generator=torch.Generator().manual_seed(1))
    cfg = TrainConfig(lr_schedule="constant", lr=3e-3, warmup_steps=1, weight_decay=0.1, eps=1e-8, **fields)
    return Trainer(model, NextToken(rows), cfg, tmp_path / name, 32)


def _losses(trainer, steps=12):
    return [trainer._train_step([torch.arange(i % 2 * 4, i % 2 * 4 + 4)])[0] for i in range(steps)]


def test_config_refuses_unknown_choices():
    with pytest.raises(ValueError, match="optimizer_impl"):
        TrainConfig(optimizer_impl="apex")
    with pytest.raises(ValueError, match="autocast"):
        TrainConfig(autocast="fp16")
    with pytest.raises(ValueError, match="compile"):
        TrainConfig.from_dict({"compile": "yes"})


def test_optimizer_impls_agree(tmp_path):
    """foreach is torch's for-loop update in multi-tensor ops (the same numbers); fused is one kernel
    (the same maths, rounded differently)."""
    ref = _trainer(tmp_path, "loop", optimizer_impl="for-loop")
    same = _trainer(tmp_path, "foreach", optimizer_impl="foreach")
    fused = _trainer(tmp_path, "fused", optimizer_impl="fused")
    losses = _losses(ref)
    assert _losses(same) == losses
    torch.testing.assert_close(_losses(fused), losses, atol=1e-5, rtol=0)
    for a, b in zip(ref.model.parameters(), same.model.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="optimizer_impl must be one of"):
        build_optimizer(ref.model, 1e-3, (0.9, 0.99), 1e-8, impl="apex")


def test_bf16_autocast_trains_like_fp32(tmp_path):
    ref = _losses(_trainer(tmp_path, "fp32"), 30)
    bf16 = _losses(_trainer(tmp_path, "bf16", autocast="bf16"), 30)
    assert bf16[-1] < bf16[0] - 1.0  # it learns
    assert abs(bf16[-1] - ref[-1]) < 0.05 * ref[-1]


def test_attention_stays_fp32_under_cpu_autocast():
    """Under CPU autocast the fused attention runs on fp32 q, k, v: the same numbers as without it."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16, generator=g) for _ in range(3))
    plain, _ = scaled_dot_product_attention(q, k, v, is_causal=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast, _ = scaled_dot_product_attention(q, k, v, is_causal=True)
        low, _ = scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True)
    assert cast.dtype == torch.float32 and torch.equal(cast, plain)
    assert low.dtype == torch.float32  # bf16 inputs are computed in fp32 as well


def test_compiled_training_equals_eager(tmp_path):
    """compile=True trains the same model (losses to 1e-5) under the same parameter names, and
    evaluation (speed.eager) runs it without compiling again for its other shapes."""
    from torch._dynamo.utils import counters

    eager_run = _trainer(tmp_path, "eager")
    compiled = _trainer(tmp_path, "compiled", compile=True)
    torch.testing.assert_close(_losses(compiled, 3), _losses(eager_run, 3), atol=1e-5, rtol=0)
    assert list(compiled.model.state_dict()) == list(eager_run.model.state_dict())
    graphs = counters["stats"]["unique_graphs"]
    with torch.no_grad(), eager():
        out = compiled.model(torch.zeros(3, 5, dtype=torch.long)).logits
    assert counters["stats"]["unique_graphs"] == graphs
    torch.testing.assert_close(out, eager_run.model(torch.zeros(3, 5, dtype=torch.long)).logits.detach(),
                               atol=1e-5, rtol=0)


def test_a_step_outside_run_works_under_a_clock_schedule(tmp_path):
    """Regression: bench/train_step.py steps a Trainer without run(); with a cosine-over-minutes
    schedule the step reads the clock, which only run() used to start (AttributeError '_clock')."""
    trainer = _trainer(tmp_path, "clock")
    trainer.cfg = TrainConfig(lr_schedule="cosine", lr=3e-3, warmup_steps=1, minutes=10.0)
    assert 0 <= trainer.elapsed() < 5
    loss, _ = trainer._train_step([torch.arange(4)])
    assert loss > 0


def test_shakespeare_char_steps_in_bf16_only_on_cpus_with_native_bf16():
    """The recipe's bf16 step is chosen by the CPU's flags, and recorded in the run's config:
    elsewhere it stays the fp32 reference."""
    flags = {"avx512_vnni": True, "avx512_bf16": False, "amx": False}
    assert not native_bf16({"flags": flags})
    assert native_bf16({"flags": {**flags, "avx512_bf16": True}})
    assert native_bf16({"flags": {**flags, "amx": True}})
    train = get_recipe("shakespeare-char").train
    assert train.autocast == ("bf16" if native_bf16() else "none")
    assert train.optimizer_impl == "fused"  # TrainConfig's default
    assert get_recipe("shakespeare-char-llama").train.autocast == "none"  # measured in fp32 only
    assert get_recipe("shakespeare-char").with_overrides(["autocast=none"]).train.autocast == "none"


def test_evaluation_runs_fp32_under_a_bf16_step(tmp_path):
    """A bf16-autocast run validates in fp32: its records and its choice of the best weights are the
    numbers `attnlab evaluate` gives (fp32) for the saved weights."""
    trainer = _trainer(tmp_path, "bf16", autocast="bf16")
    _losses(trainer, 3)
    trainer.out.mkdir(parents=True)
    record = trainer._evaluate()
    assert record["val_loss"] == trainer.objective.evaluate(trainer.model)["val_loss"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert trainer.objective.evaluate(trainer.model)["val_loss"] != record["val_loss"]


def test_shakespeare_char_mamba_steps_in_bf16_only_on_cpus_with_native_bf16():
    """shakespeare-char-mamba follows the same CPU rule (its equal-steps loss: the recipe's docstring)."""
    train = get_recipe("shakespeare-char-mamba").train
    assert train.autocast == ("bf16" if native_bf16() else "none")
    assert get_recipe("shakespeare-char-mamba").with_overrides(["autocast=none"]).train.autocast == "none"


def test_multi30k_steps_in_bf16_only_on_cpus_with_native_bf16():
    """multi30k-en-de follows the same CPU rule (its equal-steps quality: the recipe's docstring)."""
    train = get_recipe("multi30k-en-de").train
    assert train.autocast == ("bf16" if native_bf16() else "none")
    assert get_recipe("multi30k-en-de").with_overrides(["autocast=none"]).train.autocast == "none"
