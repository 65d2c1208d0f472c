import pytest
import torch

from attnlab.nn.rope import RotaryEmbedding, apply_rope, rotate_half

DH = 8


def rotate(x, positions, rotary=None):
    rotary = rotary or RotaryEmbedding(x.size(-1))
    cos, sin = rotary(torch.as_tensor(positions))
    return apply_rope(x, cos, sin)


def at(vec, m):
    """A single (1, 1, 1, Dh) vector rotated to position m."""
    return rotate(vec.view(1, 1, 1, -1), [m])[0, 0, 0]


def test_rotate_half_known_answer():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert rotate_half(x).tolist() == [-3.0, -4.0, 1.0, 2.0]


def test_dot_product_depends_only_on_relative_position():
    torch.manual_seed(0)
    q, k = torch.randn(DH), torch.randn(DH)
    for diff in (0, 1, 3, -2, 7):
        pairs = [(m, m - diff) for m in (max(diff, 0), 5 + max(diff, 0), 40 + max(diff, 0), 123)]
        dots = torch.stack([at(q, m) @ at(k, n) for m, n in pairs])
        torch.testing.assert_close(dots, dots[:1].expand_as(dots), atol=1e-5, rtol=0)
    # and it does change with the distance (the rotation is not the identity)
    assert not torch.isclose(at(q, 3) @ at(k, 0), at(q, 0) @ at(k, 0), atol=1e-4)


def test_rotation_preserves_pair_norms_and_vector_norm():
    torch.manual_seed(1)
    x = torch.randn(2, 3, 6, DH)
    pos = torch.tensor([[0, 1, 2, 10, 100, 1000], [5, 6, 7, 8, 9, 20000]])
    y = rotate(x, pos)
    half = DH // 2
    pair_norm = lambda t: (t[..., :half] ** 2 + t[..., half:] ** 2).sqrt()  # noqa: E731
    torch.testing.assert_close(pair_norm(y), pair_norm(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5, rtol=1e-5)


def test_known_angle_of_the_first_pair():
    # pair 0 rotates by m · θ^0 = m radians
    x = torch.zeros(1, 1, 1, DH)
    x[..., 0] = 1.0
    y = rotate(x, [2])[0, 0, 0]
    assert y[0].item() == pytest.approx(torch.cos(torch.tensor(2.0)).item(), abs=1e-6)
    assert y[DH // 2].item() == pytest.approx(torch.sin(torch.tensor(2.0)).item(), abs=1e-6)
    # the last pair rotates by m · θ^(-(Dh-2)/Dh)
    x = torch.zeros(1, 1, 1, DH)
    x[..., DH // 2 - 1] = 1.0
    angle = 2 * 10000.0 ** (-(DH - 2) / DH)
    y = rotate(x, [2])[0, 0, 0]
    assert y[DH // 2 - 1].item() == pytest.approx(torch.cos(torch.tensor(angle)).item(), abs=1e-6)
    assert y[DH - 1].item() == pytest.approx(torch.sin(torch.tensor(angle)).item(), abs=1e-6)


def test_suffix_with_offset_positions_equals_slice_of_whole():
    torch.manual_seed(2)
    x = torch.randn(2, 4, 10, DH)
    whole = rotate(x, torch.arange(10))
    for start in (1, 4, 9):
        part = rotate(x[:, :, start:], torch.arange(start, 10))
        torch.testing.assert_close(part, whole[:, :, start:], atol=1e-6, rtol=0)


def test_batched_positions_match_per_row_positions():
    torch.manual_seed(3)
    x = torch.randn(2, 2, 3, DH)
    pos = torch.tensor([[0, 1, 2], [7, 8, 9]])
    y = rotate(x, pos)
    for b in range(2):
        torch.testing.assert_close(y[b:b + 1], rotate(x[b:b + 1], pos[b]), atol=1e-6, rtol=0)


def test_position_zero_is_identity():
    torch.manual_seed(4)
    x = torch.randn(1, 2, 3, DH)
    torch.testing.assert_close(rotate(x, torch.zeros(3, dtype=torch.long)), x, atol=0, rtol=0)


def test_cos_sin_shapes_and_dtype():
    cos, sin = RotaryEmbedding(DH)(torch.arange(5), torch.bfloat16)
    assert cos.shape == sin.shape == (1, 1, 5, DH) and cos.dtype == torch.bfloat16
    cos, _ = RotaryEmbedding(DH)(torch.zeros(3, 5, dtype=torch.long))
    assert cos.shape == (3, 1, 5, DH)


@pytest.mark.parametrize("head_dim", [3, 7, 15])
def test_odd_head_dim_raises(head_dim):
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(head_dim)


def test_non_positive_theta_raises():
    with pytest.raises(ValueError, match="rope_theta"):
        RotaryEmbedding(DH, theta=0.0)
