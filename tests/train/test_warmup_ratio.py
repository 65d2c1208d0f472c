"""warmup_ratio: the warm-up shrinks to a fraction of a short run (of its steps, or of its minutes
budget), capped at warmup_steps, so a recipe's warm-up does not fill a budget shorter than its own."""
import math

import pytest

from attnlab.errors import UserError
from attnlab.train.config import TrainConfig
from attnlab.train.loop import learning_rate, warms_up_over_minutes
from attnlab.train.optim import budget_cosine_lr, budget_warmup, cosine_lr, warmup_steps_for


def test_warmup_steps_for_known_values():
    assert warmup_steps_for(200, 0.5, 54) == 27  # ⌈0.5 · 54⌉: a short run warms up over half of it
    assert warmup_steps_for(200, 0.5, 55) == 28  # rounded up, as Hugging Face's warmup_ratio
    assert warmup_steps_for(200, 0.5, 400) == 200  # capped at warmup_steps: a long run keeps its own
    assert warmup_steps_for(200, 0.5, 1000) == 200
    assert warmup_steps_for(200, 0.0, 54) == 200  # ratio 0: warmup_steps only
    assert warmup_steps_for(200, 0.01, 10) == 1  # at least one step
    assert warmup_steps_for(0, 0.5, 54) == 0  # no warm-up stays none


def test_budget_warmup_known_values():
    # whichever of the two ends first: 200 steps, or half of the budget
    assert budget_warmup(10, 0.25, 200, 0.5) == pytest.approx(0.5)  # by time: 0.25 / 0.5
    assert budget_warmup(150, 0.25, 200, 0.5) == pytest.approx(0.75)  # by steps: 150 / 200
    assert budget_warmup(10, 0.5, 200, 0.5) == 1.0 and budget_warmup(10, 0.9, 200, 0.5) == 1.0
    assert budget_warmup(200, 0.1, 200, 0.5) == 1.0
    assert budget_warmup(50, 0.9, 200, 0.0) == pytest.approx(0.25)  # ratio 0: steps only, as before
    assert budget_warmup(1, 0.0, 0, 0.5) == 1.0  # no warm-up


def test_budget_cosine_lr_with_a_warmup_ratio_known_values():
    lr = 2e-3
    # 54 steps of a 2-minute budget, step 14 (a quarter of the budget spent): warm-up half done
    assert budget_cosine_lr(14, 0.25, lr, 0.0, 200, 0.5) == pytest.approx(0.5 * lr * 0.5 * (1 + math.cos(math.pi / 4)))
    assert budget_cosine_lr(28, 0.5, lr, 0.0, 200, 0.5) == pytest.approx(lr / 2)  # warm, half the cosine
    # without the ratio the same step is still at 14 / 200 of its warm-up
    assert budget_cosine_lr(14, 0.25, lr, 0.0, 200) == pytest.approx(14 / 200 * lr * 0.5 * (1 + math.cos(math.pi / 4)))
    # a run that reaches warmup_steps before the ratio's fraction is unchanged by it
    for step, fraction in [(1, 0.0), (100, 0.2), (200, 0.4), (300, 0.6)]:
        assert budget_cosine_lr(step, fraction, lr, 0.0, 200, 0.5) == budget_cosine_lr(step, fraction, lr, 0.0, 200)


def test_learning_rate_uses_the_ratio_of_the_step_horizon_or_of_the_minutes():
    steps = TrainConfig(lr_schedule="cosine", lr=1e-3, warmup_steps=200, warmup_ratio=0.5, max_steps=54)
    assert learning_rate(steps, 27, 32) == pytest.approx(1e-3)  # the peak at ⌈0.5 · 54⌉
    assert learning_rate(steps, 10, 32) == pytest.approx(1e-3 * 10 / 27)
    assert [learning_rate(steps, n, 32) for n in range(1, 60)] == [cosine_lr(n, 1e-3, 0.0, 27, 54) for n in range(1, 60)]
    clock = TrainConfig(lr_schedule="cosine", lr=1e-3, warmup_steps=200, warmup_ratio=0.5, minutes=2.0)
    assert warms_up_over_minutes(clock)
    assert learning_rate(clock, 10, 32, budget_fraction=0.25) == pytest.approx(0.5 * 1e-3 * 0.5 * (1 + math.cos(math.pi / 4)))
    constant = TrainConfig(lr_schedule="constant", lr=1e-3, warmup_steps=200, warmup_ratio=0.1, minutes=2.0)
    assert learning_rate(constant, 3, 32, budget_fraction=0.05) == pytest.approx(0.5e-3)
    assert learning_rate(constant, 3, 32, budget_fraction=0.2) == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="fraction"):
        learning_rate(constant, 3, 32)
    noam = TrainConfig(lr_schedule="noam", warmup_steps=200, warmup_ratio=0.5, minutes=2.0)
    assert not warms_up_over_minutes(noam)  # noam's warm-up sets its peak: the ratio does not apply
    assert learning_rate(noam, 10, 32) == learning_rate(TrainConfig(lr_schedule="noam", warmup_steps=200), 10, 32)


@pytest.mark.parametrize("value", [-0.1, 1.0, 2.0, float("nan")])
def test_a_bad_warmup_ratio_names_the_field_and_the_allowed_values(value):
    with pytest.raises(UserError, match="warmup_ratio must be"):
        TrainConfig(warmup_ratio=value)
    with pytest.raises(UserError, match=r"warmup_ratio must be in \[0, 1\)"):
        warmup_steps_for(200, 1.5, 10)


def test_a_bad_warmup_ratio_on_the_command_line_exits_2_in_one_line(tiny_multi30k, tmp_path, capsys):
    from attnlab.cli import main
    out = tmp_path / "bad"
    assert main(["train", "--recipe", "multi30k-en-de", "--out", str(out), "--set", "warmup_ratio=1.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "warmup_ratio must be in [0, 1), got 1.5" in err and len(err.splitlines()) == 1
    assert not out.exists()


def steady_run(cfg, n_steps, d_model=256):
    """The learning rates of a run whose n_steps steps each take the same share of its minutes budget."""
    return [learning_rate(cfg, n, d_model, budget_fraction=(n - 1) / n_steps) for n in range(1, n_steps + 1)]


def test_the_10_minute_recipe_on_2_cores_is_unchanged_and_short_budgets_reach_their_peak():
    """multi30k-en-de keeps its tuned 10-minute schedule (cosine over the minutes, peak 2.5e-3 with the
    2,000-token batches, warm-up 300 steps since the batch warm-up) for runs of 546 steps
    or more (300 / 0.55; 2 cores fit ~900–1,400 in 10 minutes); a 2-minute run on one thread (54 steps) used to end at 54/200 of its warm-up and now
    peaks at ~40% of it."""
    from dataclasses import replace

    from attnlab.recipes import get_recipe
    recipe = get_recipe("multi30k-en-de")
    cfg = recipe.train
    assert (cfg.lr_schedule, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.minutes, cfg.average_last) == \
        ("cosine", 2.5e-3, 0.0, 300, 10.0, 0)
    assert recipe.data.batch_tokens == 2000 and cfg.warmup_ratio == 0.55
    assert (recipe.data.batch_tokens_start, recipe.data.batch_rampup) == (1000, 200)
    before = replace(cfg, warmup_ratio=0.0)
    for n_steps in (546, 600, 661, 932, 1000):
        assert steady_run(cfg, n_steps) == steady_run(before, n_steps)
    short, old = steady_run(cfg, 54), steady_run(before, 54)
    assert max(old) < 0.2 * cfg.lr  # the old warm-up: 54 of 200 steps, under a decaying cosine
    peak = max(range(54), key=short.__getitem__)
    assert 0.3 < short[peak] / cfg.lr < 0.5 and 20 <= peak <= 30
    assert all(a >= b for a, b in zip(short, old))
