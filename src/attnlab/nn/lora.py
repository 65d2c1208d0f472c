"""LoRA: low-rank adaptation of frozen linear layers, over an fp32 or a block-quantized base.

Shape legend: R rows (batch × tokens), I in_features, O out_features, r rank.

    h = W₀ x + (α / r) · B A dropout(x)        W₀ (O, I) frozen; A (r, I) and B (O, r) trained

B starts at zero, so an adapted model starts as its base exactly; A starts as PEFT's default does
(`init_lora_weights=True`: Kaiming-uniform with a = √5, nn.Linear's own init; the paper draws A from
a Gaussian: any random A works, since B = 0 makes the product zero either way). With `use_rslora`
the scale is α / √r (Kalajdzievski 2023), as PEFT's option of that name. The base W₀ stays what it
was: an nn.Linear (fp32 or bf16) or a QuantLinear (Q8_0 / Q4_0 / Q4_1 blocks, QLoRA's frozen
quantized base; its forward is differentiable in its input, nn/quant_linear.py), and it is never
copied. Decoding merges the adapters first (merge_lora), so the decode engines see plain layers.

apply_lora() freezes every parameter of a model, wraps the chosen layers and makes the model's
state dict its trainable tensors only (the adapters): checkpoints, best weights and snapshots then
hold a few MB instead of the base. merge_lora() folds each update into its weight (W₀ + (α/r)·BA, a
dequantized fp32 weight for a quantized base) and removes the wrappers: the plain model again.

Target names are the field's (PEFT's and transformers' LLaMA names): q_proj, k_proj, v_proj,
o_proj (attnlab's out_proj), gate_proj, up_proj, down_proj.
Sources: Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", §4.1 (the update,
its scale α/r and B = 0 at the start) and §4.2 (applied to attention weights); Dettmers et al.
2023, "QLoRA", §3 (a frozen quantized base, adapters in higher precision); PEFT's tuners/lora.
"""
from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.errors import UserError
from attnlab.nn import lora_product
from attnlab.nn.linear import Linear
from attnlab.nn.quant import dequantize
from attnlab.nn.quant_linear import QuantLinear

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MODULE_NAMES = {"o_proj": "out_proj"}  # a target's attnlab module name where it differs from the field's


class LowRank(nn.Module):
    """One factor of the update, y = x Wᵀ (no bias): lora_A (r, I) or lora_B (O, r). Not an
    nn.Linear, so that nothing that converts a model's linear layers (quantization, init) touches it."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., in_features) -> (..., out_features)."""
        return F.linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[1]}, {self.weight.shape[0]}"


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trained low-rank update (module docstring).

    Args:
        base_layer: nn.Linear or QuantLinear, frozen here. rank: r >= 1. alpha: α > 0.
        dropout: dropout probability on the update's input (the base sees x unchanged).
        use_rslora: scale α / √r instead of α / r.
    Raises:
        UserError: for a rank < 1, alpha <= 0, a dropout outside [0, 1) or a base of another kind.
    Source: Hu et al. 2021, §4.1; PEFT tuners/lora/layer.py (Linear, update_layer, reset_lora_parameters).
    """

    def __init__(self, base_layer: nn.Module, rank: int, alpha: float, dropout: float = 0.0,
                 use_rslora: bool = False):
        super().__init__()
        if not isinstance(base_layer, (nn.Linear, QuantLinear)):
            raise UserError(f"LoRA wraps nn.Linear or QuantLinear layers, not {type(base_layer).__name__}")
        if not (isinstance(rank, int) and rank >= 1):
            raise UserError(f"LoRA rank must be an integer >= 1, got {rank!r}")
        if not alpha > 0:
            raise UserError(f"LoRA alpha must be > 0, got {alpha!r}")
        if not 0.0 <= dropout < 1.0:
            raise UserError(f"LoRA dropout must be in [0, 1), got {dropout!r}")
        self.base_layer = base_layer.requires_grad_(False)
        self.rank, self.alpha, self.use_rslora = rank, float(alpha), use_rslora
        self.scaling = self.alpha / (math.sqrt(rank) if use_rslora else rank)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.lora_A = LowRank(self.in_features, rank)
        self.lora_B = LowRank(rank, self.out_features)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    def update(self, x: torch.Tensor) -> torch.Tensor:
        """The adapter's term (α/r) · B A dropout(x): (..., I) -> (..., O), in the adapters' dtype."""
        a = self.lora_A.weight
        return self.lora_B(self.lora_A(self.lora_dropout(x.to(a.dtype)))) * self.scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., I) -> (..., O): base_layer(x) + update(x). In training (gradients on) one autograd
        function computes both, saving only the adapters' inputs (nn/lora_product.py)."""
        a = self.lora_A.weight
        if torch.is_grad_enabled() and a.requires_grad and lora_product.usable(self.base_layer, x, a):
            xd = None if isinstance(self.lora_dropout, nn.Identity) else self.lora_dropout(x)
            return lora_product.LoRAProduct.apply(x, xd, a, self.lora_B.weight, self.base_layer, self.scaling)
        y = self.base_layer(x)
        return y + self.update(x).to(y.dtype)

    @torch.no_grad()
    def delta_weight(self) -> torch.Tensor:
        """(O, I) fp32: (α/r) · B A, the update as a weight."""
        return (self.lora_B.weight.float() @ self.lora_A.weight.float()) * self.scaling

    @torch.no_grad()
    def merged(self) -> Linear:
        """A Linear (nn/linear.py) computing this layer: weight W₀ + (α/r)·BA (W₀ dequantized to fp32 for a
        quantized base; the sum in float64, rounded once), bias the base's."""
        base = self.base_layer
        weight = dequantize(base.qweight) if isinstance(base, QuantLinear) else base.weight
        fused = (weight.double() + self.delta_weight().double()).to(torch.float32 if isinstance(base, QuantLinear)
                                                                    else weight.dtype)
        layer = Linear(self.in_features, self.out_features, bias=base.bias is not None,
                          device=weight.device, dtype=fused.dtype)
        layer.weight.copy_(fused)
        if base.bias is not None:
            layer.bias.copy_(base.bias)
        return layer

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}, scaling={self.scaling:g}"


def target_pattern(targets) -> re.Pattern:
    """The regular expression a module name (attnlab's) must end with to be adapted: the targets'
    module names (o_proj -> out_proj)."""
    names = sorted({MODULE_NAMES.get(t, t) for t in targets})
    return re.compile(r"(.*\.)?(" + "|".join(map(re.escape, names)) + r")")


def check_targets(targets) -> tuple[str, ...]:
    """The targets as a tuple, or UserError naming an unknown one (listing TARGETS)."""
    targets = tuple(targets)
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets:
        raise UserError(f"LoRA target modules must be a non-empty list of {', '.join(TARGETS)}; got {list(targets)}")
    return targets


def apply_lora(model: nn.Module, targets, rank: int, alpha: float, dropout: float = 0.0,
               use_rslora: bool = False) -> list[str]:
    """Freeze `model`, wrap every linear layer named by `targets` in a LoRALinear, and make the
    model's state dict its trainable tensors only (module docstring). In place.

    Args:
        targets: names from TARGETS (each must match at least one layer).
    Returns:
        the wrapped modules' names (attnlab's).
    Raises:
        UserError: an unknown or unmatched target, an invalid rank / alpha / dropout, or a model that
            already has adapters.
    """
    targets = check_targets(targets)
    pattern = target_pattern(targets)
    names = [n for n in linear_layers(model) if pattern.fullmatch(n)]
    missing = [t for t in targets if not any(n.rsplit(".", 1)[-1] == MODULE_NAMES.get(t, t) for n in names)]
    if missing:
        raise UserError(f"LoRA target module(s) {missing} match no linear layer of {type(model).__name__}")
    return adapt(model, names, rank, alpha, dropout, use_rslora)


def linear_layers(model: nn.Module) -> list[str]:
    """Names of the layers LoRA can wrap (nn.Linear, QuantLinear), in module order."""
    return [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, QuantLinear))]


def adapt(model: nn.Module, names: list[str], rank: int, alpha: float, dropout: float = 0.0,
          use_rslora: bool = False, ranks: dict[str, tuple[int, float]] | None = None) -> list[str]:
    """apply_lora for explicit layer names (linear_layers): freeze, wrap, state dict = adapters.

    Args:
        ranks: {name: (rank, alpha)} for layers whose rank or alpha differ (PEFT's rank_pattern).
    Raises:
        UserError: for a model that already has adapters, a name that is not a linear layer, or an
            invalid rank / alpha / dropout.
    """
    if lora_layers(model):
        raise UserError("the model already has LoRA adapters (merge_lora them first)")
    model.requires_grad_(False)
    for name in names:
        module = model.get_submodule(name)
        r, a = (ranks or {}).get(name, (rank, alpha))
        parent, leaf = _parent(model, name)
        setattr(parent, leaf, LoRALinear(module, r, a, dropout, use_rslora))
    model._lora_hooks = (model.register_state_dict_post_hook(_trainable_only),
                         model.register_load_state_dict_post_hook(_ignore_frozen))
    return list(names)


def _trainable_names(module: nn.Module) -> set[str]:
    return {n for n, p in module.named_parameters() if p.requires_grad}


def _trainable_only(module: nn.Module, state: dict, prefix: str, local_metadata) -> None:
    """State-dict post-hook: drop the frozen tensors (the base)."""
    keep = _trainable_names(module)
    for key in [k for k in state if k.startswith(prefix) and k[len(prefix):] not in keep]:
        del state[key]


def _ignore_frozen(module: nn.Module, incompatible) -> None:
    """load_state_dict post-hook: the frozen base is not expected in a state dict (it is not in one)."""
    keep = _trainable_names(module)

    def trainable(key: str) -> bool:
        parts = key.split(".")
        return any(".".join(parts[i:]) in keep for i in range(len(parts)))

    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if trainable(k)]


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    *path, leaf = name.split(".")
    return model.get_submodule(".".join(path)) if path else model, leaf


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """{name: LoRALinear} of the model's adapted layers, in module order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its layer (LoRALinear.merged) and remove the wrappers and the
    state-dict hooks: the plain model, whose outputs are the adapted model's up to rounding. The
    merged model's parameters are frozen as they were (requires_grad False). In place; returns it."""
    for name, layer in lora_layers(model).items():
        parent, leaf = _parent(model, name)
        setattr(parent, leaf, layer.merged().requires_grad_(False))
    for handle in getattr(model, "_lora_hooks", ()):
        handle.remove()
    model._lora_hooks = ()
    return model


def trainable_parameters(model: nn.Module) -> int:
    """Parameters that require a gradient (shared ones once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
