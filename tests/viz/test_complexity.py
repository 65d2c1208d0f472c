"""complexity: the explicit math path's memory grows as T², SDPA's extra memory does not (time is
measured in the figure, not asserted: these machines are shared)."""
import pytest

from attnlab.viz import complexity, peak_memory


@pytest.mark.skipif(not peak_memory.supported(), reason="peak memory is measured from Linux's /proc only")
def test_math_memory_slope_is_two_and_sdpa_is_not_quadratic():
    lengths = [256, 512, 1024]
    memory = complexity.measure_memory(4, 32, lengths)
    math_bytes, sdpa_bytes = memory["math"], memory["sdpa"]
    r = complexity.ComplexityResult(4, 32, lengths, {}, memory)
    assert r.slope(math_bytes) == pytest.approx(2.0, abs=0.15)
    scores = 4 * 1024 * 1024 * 4  # one (H, T, T) fp32 score tensor at T = 1024
    assert math_bytes[-1] >= scores
    # SDPA never holds the scores: its peak stays below an eighth of them. (Not its slope: its
    # readings are small, ~0.1-1 MB, and page reuse makes one of them now and then near 0.)
    assert max(sdpa_bytes) < scores / 8


def test_slope_is_the_log_log_fit():
    """The fitted exponent of the figure (times are measured in the figure and in bench/, never asserted)."""
    r = complexity.ComplexityResult(2, 32, [512, 1024, 2048], {}, None)
    assert r.slope([3.0, 12.0, 48.0]) == pytest.approx(2.0) and r.slope([1.0, 2.0, 4.0]) == pytest.approx(1.0)


def test_caption_states_the_texts_figure(tmp_path):
    r = complexity.complexity((64, 128, 256), heads=2, head_dim=16, repeats=1, memory=False)
    assert r.ratio_1k_to_128k == 16384 and "(128)² = 16,384×" in r.caption
    complexity.draw_complexity(r, tmp_path / "c.png")
    with pytest.raises(ValueError, match="at least 3 distinct lengths"):
        complexity.complexity((64, 64, 128))
