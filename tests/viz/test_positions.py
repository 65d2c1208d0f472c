"""positions: PE(p)·PE(p+k) depends on k only, RoPE scores are flat for a fixed m − n, and the clock
hands turn at the encoding's frequencies."""
import math

import numpy as np

from attnlab.nn.positional import sinusoidal_table
from attnlab.viz import positions


def test_pe_similarity_depends_on_the_offset_only():
    table = sinusoidal_table(300, 64)
    offsets = np.arange(0, 100)
    dots = positions.sinusoid_dots(table, [0, 7, 50, 199], offsets)
    np.testing.assert_allclose(dots, np.broadcast_to(dots[0], dots.shape), atol=1e-3)
    expected = [sum(math.cos(k * 10000 ** (-2 * i / 64)) for i in range(32)) for k in offsets]  # Σ cos(kω_i)
    np.testing.assert_allclose(dots[0], expected, atol=1e-3)


def test_rope_score_is_flat_for_a_fixed_gap():
    m = np.arange(20, 400)
    scores = positions.rope_scores(64, 10000.0, [0, 5, 17], m)
    assert np.ptp(scores, axis=1).max() < 1e-3 * np.abs(scores).max()
    assert np.ptp(scores[:, 0]) > 0.1  # but it does depend on the gap


def test_figure_data_and_clock_angles(tmp_path):
    r = positions.positions_figure_data()
    assert r.pe_spread < 1e-3 and r.rope_spread < 1e-3
    omega = np.array([10000 ** (-2 * i / r.table.shape[1]) for i in r.clock_pairs])
    expected = (np.outer(omega, r.clock_positions)) % (2 * np.pi)
    diff = np.angle(np.exp(1j * (r.clock_angles - expected)))
    assert np.abs(diff).max() < 1e-4
    norms = np.linalg.norm(r.rope_points, axis=-1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-6)  # rotation keeps the pair's length
    positions.draw_positions(r, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size < 150_000
