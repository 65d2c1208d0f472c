import math

import pytest
import torch

from attnlab.train.optim import clip_normalised_, cosine_lr, noam_lr


def test_noam_known_values_and_peak_at_warmup():
    d, w = 512, 4000
    peak = noam_lr(w, d, w)
    assert math.isclose(peak, 512 ** -0.5 * 4000 ** -0.5)
    assert math.isclose(noam_lr(1, d, w), 512 ** -0.5 * 4000 ** -1.5)
    assert noam_lr(w - 1, d, w) < peak and noam_lr(w + 1, d, w) < peak
    assert math.isclose(noam_lr(4 * w, d, w), peak / 2)  # inverse square-root decay
    assert math.isclose(noam_lr(w, d, w, factor=2.0), 2 * peak)


# ----------------------------------------------------------------------------- cosine
LR, LOW, WARM, DECAY = 1e-3, 1e-4, 10, 109  # the cosine spans D − W + 1 = 100 steps from the peak


def f(step, low=LOW, warm=WARM, decay=DECAY):
    return cosine_lr(step, LR, low, warm, decay)


def test_cosine_lr_known_values():
    assert f(1) == pytest.approx(1e-4) and f(5) == pytest.approx(5e-4)
    assert f(WARM) == LR and max(f(s) for s in range(1, 300)) == LR  # the peak: exactly step warmup_steps
    assert f(WARM + 1) == pytest.approx(LOW + 0.5 * (1 + math.cos(math.pi / 100)) * (LR - LOW))
    assert f(35) == pytest.approx(LOW + 0.5 * (1 + math.cos(math.pi / 4)) * (LR - LOW))
    assert f(60) == pytest.approx((LR + LOW) / 2)
    assert f(DECAY) == pytest.approx(LOW + 0.5 * (1 + math.cos(math.pi * 99 / 100)) * (LR - LOW))
    assert f(DECAY) > LOW and f(DECAY + 1) == LOW and f(10 * DECAY) == LOW
    values = [f(s) for s in range(WARM, DECAY + 2)]
    assert all(a > b for a, b in zip(values, values[1:]))


@pytest.mark.parametrize("steps,warm", [(1500, 150), (12, 2), (3, 1), (2, 1), (1, 0), (5, 0)])
def test_every_step_of_the_budget_has_a_positive_learning_rate(steps, warm):
    """Issue 12 item 4: with min_lr 0 and decay = max_steps (sst2: 1500 steps, 150 warm-up), the last
    step ran at learning rate 0; now all of them run above 0 and min_lr comes one step after."""
    lrs = [f(s, low=0.0, warm=warm, decay=steps) for s in range(1, steps + 1)]
    assert min(lrs) > 0
    assert f(steps + 1, low=0.0, warm=warm, decay=steps) == 0.0
    assert max(lrs) == LR and lrs[max(warm, 1) - 1] == LR  # the peak at warmup_steps (step 1 without)


def test_sst2_last_step_known_value():
    last = cosine_lr(1500, 2e-4, 0.0, 150, 1500)
    assert last == pytest.approx(2e-4 * 0.5 * (1 + math.cos(math.pi * 1350 / 1351)))
    assert 2.7e-10 < last < 2.71e-10


def test_cosine_lr_equals_hugging_face_shifted_by_one_step():
    """Hugging Face's cosine schedule with min_lr, num_warmup_steps W and num_training_steps D + 1,
    read at its steps 1..D + 1 (its step 0 runs at learning rate 0)."""
    optimization = pytest.importorskip("transformers.optimization")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    schedule = optimization.get_cosine_with_min_lr_schedule_with_warmup(opt, WARM, DECAY + 1, min_lr=LOW)
    hf = []
    for _ in range(DECAY + 2):
        hf.append(opt.param_groups[0]["lr"])
        opt.step()
        schedule.step()
    assert hf[0] == 0.0
    ours = [f(s) for s in range(1, DECAY + 2)]
    assert max(abs(a - b) for a, b in zip(hf[1:], ours)) < 1e-15


@pytest.mark.parametrize("args,name", [((0, 1e-3, 0.0, 10, 100), "step"), ((1, 1e-3, 0.0, -1, 100), "warmup_steps"),
                                       ((1, 1e-3, 0.0, 0, 0), "decay_steps")])
def test_cosine_lr_bad_input_raises_naming_the_field(args, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        cosine_lr(*args)


# ----------------------------------------------------------------------------- cosine over a time budget
def test_budget_cosine_lr_known_values():
    from attnlab.train.optim import budget_cosine_lr
    assert budget_cosine_lr(5, 0.0, LR, LOW, WARM) == pytest.approx(LR / 2)  # warm-up: step 5 of 10
    assert budget_cosine_lr(20, 0.0, LR, LOW, WARM) == LR
    assert budget_cosine_lr(20, 0.5, LR, LOW, WARM) == pytest.approx((LR + LOW) / 2)
    assert budget_cosine_lr(20, 1.0, LR, LOW, WARM) == pytest.approx(LOW)
    assert budget_cosine_lr(20, 3.0, LR, LOW, WARM) == pytest.approx(LOW)  # past the budget: the floor
    assert budget_cosine_lr(1, 0.25, LR, 0.0, 0) == pytest.approx(LR * 0.5 * (1 + math.cos(math.pi / 4)))
    with pytest.raises(ValueError, match="fraction"):
        budget_cosine_lr(3, -0.1, LR, LOW, WARM)


@pytest.mark.parametrize("max_norm", [1e-3, 1.0, 1e6])
def test_clip_normalised_is_scale_then_clip_in_one_multiply(max_norm):
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(5, 3, generator=g) * 40, torch.randn(7, generator=g)]
    params = [torch.nn.Parameter(torch.zeros_like(x)) for x in grads]
    for p, x in zip(params, grads):
        p.grad = x.clone()
    torch._foreach_mul_([p.grad for p in params], 1 / 37)
    want_norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    norm = clip_normalised_(grads, 1 / 37, max_norm)
    torch.testing.assert_close(norm, want_norm)
    for x, p in zip(grads, params):
        torch.testing.assert_close(x, p.grad, atol=0, rtol=2e-6)
    assert clip_normalised_([], 0.5, 1.0) == 0
