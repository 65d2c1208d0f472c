"""The Vision Transformer: an image as a sequence of flattened patches, a [CLS] token, a Pre-LN encoder.

Shape legend: B batch, C channels, H height, W width (pixels), P patch side, N patches (H/P · W/P),
D model dim, K classes. Patches are taken row by row, and each patch is flattened as (P, P, C)
(row, column, channel), so patch n of image b is images[b, :, i·P:(i+1)·P, j·P:(j+1)·P] with
n = i · (W/P) + j.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, Optional

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.config import Config, check, check_literals
from attnlab.errors import UserError
from attnlab.models.base import Model
from attnlab.nn.blocks import encoder_layer


@dataclass
class ViTConfig(Config):
    """The Vision Transformer (Dosovitskiy et al. 2021): P×P patches, [CLS], learned positions, Pre-LN."""

    model_type: ClassVar[str] = "vit"  # the run's kind: config.json's "model_type", the task registry key

    image_size: int = 224             # training image side (square); other sizes interpolate positions
    patch_size: int = 16              # P; image_size % patch_size == 0
    in_channels: int = 3              # C (1 for MNIST)
    n_classes: int = 1000             # classes of the head
    d_model: int = 768                # hidden size D
    n_layers: int = 12                # encoder layers
    n_heads: int = 12                 # attention heads; d_model % n_heads == 0
    d_ff: Optional[int] = None        # MLP hidden size; None = 4 * d_model (read ffn_dim)
    dropout: float = 0.0              # on embeddings and sublayer outputs
    attention_dropout: float = 0.0    # on attention weights
    norm_eps: float = 1e-6            # LayerNorm ε (ViT's)
    attention_impl: Literal["sdpa", "math"] = "sdpa"  # fused kernel or explicit math

    def __post_init__(self):
        check_literals(self)
        check(self.d_ff is None or (isinstance(self.d_ff, int) and self.d_ff > 0), "d_ff", "None or a positive integer",
              self.d_ff)
        for name in ("image_size", "patch_size", "in_channels", "n_classes", "d_model", "n_layers", "n_heads"):
            value = getattr(self, name)
            check(isinstance(value, int) and value > 0, name, "a positive integer", value)
        check(self.image_size % self.patch_size == 0, "image_size", f"divisible by patch_size={self.patch_size}",
               self.image_size)
        check(self.d_model % self.n_heads == 0, "d_model", f"divisible by n_heads={self.n_heads}", self.d_model)
        for name in ("dropout", "attention_dropout"):
            check(0.0 <= getattr(self, name) < 1.0, name, "in [0, 1)", getattr(self, name))

    @property
    def ffn_dim(self) -> int:
        """The FFN's hidden size: d_ff, or 4·D when it is None."""
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def grid(self) -> int:
        """Patches per side at the training size."""
        return self.image_size // self.patch_size


def _check_divisible(h: int, w: int, patch_size: int) -> None:
    if h <= 0 or w <= 0:
        raise UserError(f"image size {h}×{w} is empty (at least one {patch_size}×{patch_size} patch is needed)")
    if h % patch_size or w % patch_size:
        raise UserError(f"image size {h}×{w} is not divisible by patch_size {patch_size}")


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Cut images into non-overlapping P×P patches and flatten each (x_p of ViT eq. 1).

    Args:
        images: (B, C, H, W), H and W multiples of P.
        patch_size: P.
    Returns:
        (B, N, P·P·C), N = (H/P)·(W/P), patches in row-major order, each flattened as (P, P, C).
    Raises:
        ValueError: when H or W is not a multiple of P (naming the size and P).
    Source: Dosovitskiy et al. 2021, §3.1 ("reshape the image x ∈ R^{H×W×C} into a sequence of
        flattened 2D patches x_p ∈ R^{N×(P²·C)}").
    """
    b, c, h, w = images.shape
    p = patch_size
    _check_divisible(h, w, p)
    x = images.reshape(b, c, h // p, p, w // p, p)  # (B, C, H/P, P, W/P, P)
    x = x.permute(0, 2, 4, 3, 5, 1)  # (B, H/P, W/P, P, P, C)
    return x.reshape(b, (h // p) * (w // p), p * p * c)  # (B, N, P·P·C)


def unpatchify(patches: torch.Tensor, patch_size: int, channels: int, height: int, width: int) -> torch.Tensor:
    """The exact inverse of patchify.

    Args:
        patches: (B, N, P·P·C) with N = (height/P)·(width/P).
        patch_size: P. channels: C. height, width: H, W of the images.
    Returns:
        (B, C, H, W).
    Raises:
        ValueError: when the size is not divisible by P or the patches do not fit it.
    """
    b, n, f = patches.shape
    p = patch_size
    _check_divisible(height, width, p)
    gh, gw = height // p, width // p
    if n != gh * gw or f != p * p * channels:
        raise UserError(f"patches of shape {tuple(patches.shape)} do not make {channels}×{height}×{width} images "
                        f"with patch_size {p} (expected (B, {gh * gw}, {p * p * channels}))")
    x = patches.reshape(b, gh, gw, p, p, channels)  # (B, H/P, W/P, P, P, C)
    x = x.permute(0, 5, 1, 3, 2, 4)  # (B, C, H/P, P, W/P, P)
    return x.reshape(b, channels, height, width)


def interpolate_positions(pos: torch.Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int]) -> torch.Tensor:
    """Resample learned patch position embeddings to another patch grid, [CLS] row untouched.

    Bicubic interpolation of the (h, w) grid of embeddings to (h2, w2); at new_grid == old_grid the
    table is returned unchanged.

    Args:
        pos: (1, 1 + h·w, D) position embeddings, row 0 for [CLS].
        old_grid: (h, w) patches per column and row that `pos` was learned for.
        new_grid: (h2, w2) patches per column and row of the new images.
    Returns:
        (1, 1 + h2·w2, D).
    Raises:
        ValueError: when pos does not have 1 + h·w rows.
    Source: Dosovitskiy et al. 2021, §3.2 ("we perform 2D interpolation of the pre-trained position
        embeddings, according to their location in the original image").
    """
    (h, w), (h2, w2) = old_grid, new_grid
    if pos.dim() != 3 or pos.size(1) != 1 + h * w:
        raise UserError(f"position table of shape {tuple(pos.shape)} does not match a {h}×{w} grid "
                        f"(expected (1, {1 + h * w}, D))")
    if (h, w) == (h2, w2):
        return pos
    cls, grid = pos[:, :1], pos[:, 1:]
    d = grid.size(-1)
    grid = grid.reshape(1, h, w, d).permute(0, 3, 1, 2)  # (1, D, h, w)
    grid = F.interpolate(grid.float(), size=(h2, w2), mode="bicubic", align_corners=False).to(pos.dtype)
    grid = grid.permute(0, 2, 3, 1).reshape(1, h2 * w2, d)  # (1, h2·w2, D)
    return torch.cat([cls, grid], dim=1)


class VisionTransformer(Model):
    """ViT: z_0 = [x_class; x_p¹E; …; x_pᴺE] + E_pos (eq. 1), L Pre-LN encoder layers of multi-head
    self-attention and GELU MLP (eq. 2–3), y = LN(z_L⁰) (eq. 4), then a linear head on y.

    Weights are drawn from a truncated normal with std 0.02 (position table and [CLS] token too),
    biases start at zero.

    Source: Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words", §3.1 (eq. 1–4) and §3.2
        (position interpolation for higher resolution).
    """

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        d, p = cfg.d_model, cfg.patch_size
        self.patch_embed = nn.Linear(p * p * cfg.in_channels, d)  # E of eq. 1
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))  # x_class
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + cfg.grid * cfg.grid, d))  # E_pos
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(
            encoder_layer(d_model=d, n_heads=cfg.n_heads, d_ff=cfg.ffn_dim, activation="gelu", norm_position="pre",
                          dropout=cfg.dropout, attention_dropout=cfg.attention_dropout, norm_eps=cfg.norm_eps,
                          impl=cfg.attention_impl) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.head = nn.Linear(d, cfg.n_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02, a=-0.04, b=0.04)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        nn.init.trunc_normal_(self.pos_embed, std=0.02, a=-0.04, b=0.04)
        nn.init.trunc_normal_(self.cls_token, std=0.02, a=-0.04, b=0.04)

    def positions(self, grid: tuple[int, int]) -> torch.Tensor:
        """(1, 1 + h·w, D) position embeddings for an (h, w) patch grid, interpolated from the training
        grid when it differs."""
        g = self.cfg.grid
        return interpolate_positions(self.pos_embed, (g, g), grid)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """The encoder's normalised output for every token.

        Args:
            images: (B, C, H, W) float, normalised as in training; H and W multiples of patch_size
                (other sizes than image_size use interpolated positions).
        Returns:
            (B, 1 + N, D); row 0 is [CLS].
        Raises:
            ValueError: for a tensor that is not 4-D, a wrong channel count, or a size not divisible
                by patch_size (each naming the values).
        """
        if images.dim() != 4:
            raise UserError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}")
        b, c, h, w = images.shape
        if c != self.cfg.in_channels:
            raise UserError(f"images have {c} channels, the model expects {self.cfg.in_channels}")
        p = self.cfg.patch_size
        _check_divisible(h, w, p)
        x = self.patch_embed(patchify(images, p))  # (B, N, D)
        x = torch.cat([self.cls_token.expand(b, -1, -1), x], dim=1)  # (B, 1 + N, D)
        x = self.dropout(x + self.positions((h // p, w // p)))
        for layer in self.layers:
            x = layer(x).hidden  # every image has all its patches: no mask
        return self.norm(x)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Classify a batch of images.

        Args:
            images: (B, C, H, W) float, normalised as in training.
        Returns:
            (B, K) float logits.
        Raises:
            ValueError: as features().
        Source: Dosovitskiy et al. 2021, §3.1, eq. 1–4 (the head on y = LN(z_L⁰)).
        """
        return self.head(self.features(images)[:, 0])
