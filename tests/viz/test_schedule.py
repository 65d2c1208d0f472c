"""schedule: the drawn learning rates are train/optim.py's with each recipe's own settings, and the
smoothed target is the distribution the label-smoothed loss trains towards."""
import numpy as np
import pytest

from attnlab.recipes import get_recipe
from attnlab.train.optim import cosine_lr, noam_lr
from attnlab.viz import schedule


def test_noam_curve_is_optims_with_the_recipes_settings():
    c = schedule.lr_curve("multi30k-en-de")
    cfg, d = get_recipe("multi30k-en-de").train, get_recipe("multi30k-en-de").model.d_model
    assert c.schedule == "noam" and c.warmup_steps == cfg.warmup_steps == 400
    np.testing.assert_array_equal(c.lr, [noam_lr(int(s), d, cfg.warmup_steps, cfg.lr_factor) for s in c.steps])
    assert c.peak == (400, pytest.approx(noam_lr(400, d, 400, cfg.lr_factor)))


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
