import math

from attnlab.train.optim import noam_lr


def test_noam_known_values_and_peak_at_warmup():
    d, w = 512, 4000
    peak = noam_lr(w, d, w)
    assert math.isclose(peak, 512 ** -0.5 * 4000 ** -0.5)
    assert math.isclose(noam_lr(1, d, w), 512 ** -0.5 * 4000 ** -1.5)
    assert noam_lr(w - 1, d, w) < peak and noam_lr(w + 1, d, w) < peak
    assert math.isclose(noam_lr(4 * w, d, w), peak / 2)  # inverse square-root decay
    assert math.isclose(noam_lr(w, d, w, factor=2.0), 2 * peak)
