"""schedule: the drawn learning rates are train/optim.py's with each recipe's own settings, and the
smoothed target is the distribution the label-smoothed loss trains towards."""
import numpy as np
import pytest

from attnlab.recipes import get_recipe
from attnlab.train.optim import budget_cosine_lr, cosine_lr, noam_lr
from attnlab.viz import schedule


def test_noam_curve_is_optims_with_the_recipes_settings(monkeypatch):
    noam = get_recipe("multi30k-en-de").with_overrides(["lr_schedule=noam", "warmup_steps=400"])
    monkeypatch.setattr(schedule, "get_recipe", lambda name: noam)
    c = schedule.lr_curve("multi30k-en-de")
    cfg, d = noam.train, noam.model.d_model
    assert c.schedule == "noam" and c.warmup_steps == cfg.warmup_steps == 400
    np.testing.assert_array_equal(c.lr, [noam_lr(int(s), d, cfg.warmup_steps, cfg.lr_factor) for s in c.steps])
    assert c.peak == (400, pytest.approx(noam_lr(400, d, 400, cfg.lr_factor)))


def test_a_cosine_over_the_minutes_budget_is_drawn_over_equal_steps():
    """multi30k-en-de decays over its 10 minutes: drawn as if they held `steps` steps of equal length."""
    c = schedule.lr_curve("multi30k-en-de", steps=500)
    cfg = get_recipe("multi30k-en-de").train
    assert c.schedule == "cosine" and c.warmup_steps == cfg.warmup_steps and len(c.steps) == 500
    expected = [budget_cosine_lr(int(s), (int(s) - 1) / 500, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.warmup_ratio)
                for s in c.steps]  # 500 steps: the warm-up ends at 55% of the budget (275 < 300 steps)
    np.testing.assert_allclose(c.lr, expected, rtol=1e-12)
    assert c.settings["decay_steps"] == "10 min" and c.lr[-1] < 1e-2 * cfg.lr


def test_cosine_curve_is_optims_with_the_recipes_settings():
    c = schedule.lr_curve("shakespeare-char")
    cfg = get_recipe("shakespeare-char").train
    assert c.schedule == "cosine" and len(c.steps) == cfg.max_steps == 2000
    expected = [cosine_lr(int(s), cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.lr_decay_steps) for s in c.steps]
    np.testing.assert_array_equal(c.lr, expected)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_smoothed_target(eps):
    q = schedule.smoothed_target(eps, vocab=10, target=3, pad_id=0)
    assert q.sum() == pytest.approx(1.0, abs=1e-6) and q[0] == pytest.approx(0.0, abs=1e-7)
    assert q[3] == pytest.approx(1 - eps + eps / 9, abs=1e-6)
    np.testing.assert_allclose(np.delete(q, [0, 3]), eps / 9, atol=1e-6)


def test_figure_and_bad_epsilon(tmp_path):
    r = schedule.schedule_figure_data()
    assert r.epsilon == 0.1 and [c.recipe for c in r.curves] == list(schedule.RECIPES)
    schedule.draw_schedule(r, tmp_path / "s.png")
    with pytest.raises(ValueError, match="--epsilon must be in"):
        schedule.schedule_figure_data(epsilon=1.5)
    with pytest.raises(ValueError, match="unknown recipe 'nope'; known recipes"):
        schedule.schedule_figure_data(("nope",))
