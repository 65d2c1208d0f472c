"""Vision Transformer: patches round-trip, position interpolation, input checks, over-fitting, batch invariance."""
import pytest
import torch
import torch.nn.functional as F

from attnlab.models.vit import ViTConfig
from attnlab.data.datasets import DatasetNotFoundError, find_dataset
from attnlab.models.vit import VisionTransformer, interpolate_positions, patchify, unpatchify


def tiny_vit(**kw) -> VisionTransformer:
    base = dict(image_size=8, patch_size=4, in_channels=1, n_classes=10, d_model=32, n_layers=2, n_heads=4, d_ff=64)
    return VisionTransformer(ViTConfig(**{**base, **kw}))


# ----------------------------------------------------------------------------- patches
@pytest.mark.parametrize("shape,p", [((2, 3, 8, 12), 4), ((1, 1, 28, 28), 7), ((3, 2, 6, 4), 2)])
def test_unpatchify_inverts_patchify(shape, p):
    x = torch.randn(shape)
    patches = patchify(x, p)
    b, c, h, w = shape
    assert patches.shape == (b, (h // p) * (w // p), p * p * c)
    assert torch.equal(unpatchify(patches, p, c, h, w), x)


def test_patches_are_row_major_and_flattened_row_column_channel():
    x = torch.randn(1, 3, 8, 12)
    patches = patchify(x, 4)  # grid 2 × 3
    assert torch.equal(patches[0, 4], x[0, :, 4:8, 4:8].permute(1, 2, 0).reshape(-1))  # row 1, column 1
    one = torch.randn(2, 1, 28, 28)  # one channel: the same as torch's unfold
    assert torch.equal(patchify(one, 7), F.unfold(one, 7, stride=7).transpose(1, 2))


def test_patchify_refuses_an_indivisible_size():
    with pytest.raises(ValueError, match="30×28 is not divisible by patch_size 4"):
        patchify(torch.zeros(1, 1, 30, 28), 4)


# ----------------------------------------------------------------------------- positions
def test_interpolate_positions_grid_sizes_identity_and_cls():
    d = 8
    pos = torch.randn(1, 1 + 14 * 14, d)
    assert interpolate_positions(pos, (14, 14), (14, 14)) is pos  # exact identity at the training grid
    wide = interpolate_positions(pos, (14, 14), (224 // 16, 320 // 16))
    assert wide.shape == (1, 1 + 14 * 20, d)
    assert torch.equal(wide[:, 0], pos[:, 0])  # [CLS] row untouched
    tall = interpolate_positions(pos, (14, 14), (7, 3))
    assert tall.shape == (1, 1 + 7 * 3, d) and torch.equal(tall[:, 0], pos[:, 0])
    const = torch.cat([torch.zeros(1, 1, d), torch.ones(1, 4 * 6, d) * 0.5], dim=1)  # non-square source
    torch.testing.assert_close(interpolate_positions(const, (4, 6), (8, 5))[:, 1:], torch.full((1, 40, d), 0.5))
    with pytest.raises(ValueError, match="3×3 grid"):
        interpolate_positions(pos, (3, 3), (4, 4))


def test_other_image_sizes_use_interpolated_positions():
    model = tiny_vit(image_size=32, patch_size=16, d_model=16, n_heads=2, n_layers=1, d_ff=32).eval()
    images = torch.randn(2, 1, 224, 320)
    with torch.no_grad():
        assert model(images).shape == (2, 10)
        feats = model.features(images)
    assert feats.shape == (2, 1 + 14 * 20, 16)
    assert torch.equal(model.positions((2, 2)), model.pos_embed)


# ----------------------------------------------------------------------------- errors
def test_wrong_channels_and_indivisible_sizes_name_both_values():
    model = tiny_vit()
    with pytest.raises(ValueError, match="images have 3 channels, the model expects 1"):
        model(torch.zeros(1, 3, 8, 8))
    with pytest.raises(ValueError, match="image size 10×8 is not divisible by patch_size 4"):
        model(torch.zeros(1, 1, 10, 8))
    with pytest.raises(ValueError, match="image_size"):
        ViTConfig(image_size=30, patch_size=4)


# ----------------------------------------------------------------------------- init, invariance, learning
def test_init_zero_biases_and_small_weights():
    model = tiny_vit(d_model=64, d_ff=128)
    assert all(float(m.bias.detach().abs().max()) == 0 for m in model.modules() if isinstance(m, torch.nn.Linear))
    w = model.layers[0].ffn.up_proj.weight.detach()
    assert 0.015 < float(w.std()) < 0.021 and float(w.abs().max()) <= 0.04  # truncated at 2 std
    assert model.pos_embed.shape == (1, 1 + 2 * 2, 64) and model.cls_token.shape == (1, 1, 64)


def test_logits_of_an_image_do_not_depend_on_the_rest_of_the_batch():
    model = tiny_vit().eval()
    images = torch.randn(5, 1, 8, 8)
    with torch.no_grad():
        together = model(images)
        alone = torch.cat([model(images[i:i + 1]) for i in range(5)])
        reordered = model(images.flip(0)).flip(0)
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(together, reordered, atol=1e-5, rtol=1e-5)


def _tiny_digits(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        find_dataset("digits", download=False)
    except DatasetNotFoundError as e:
        pytest.skip(f"the digits data set is not on this machine ({e})")
    from attnlab.data.images import load_images
    images, labels = load_images("digits")
    return images[:n], labels[:n]


def test_tiny_vit_overfits_a_tiny_set_of_digits():
    images, labels = _tiny_digits(40)
    x = (images - images.mean()) / images.std()
    torch.manual_seed(0)
    model = tiny_vit()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = F.cross_entropy(model(x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(-1) == labels).float().mean().item()
    assert accuracy == 1.0 and loss.item() < 0.05
