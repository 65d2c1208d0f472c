"""Selective recomputation: an activation that is a cheap function of tensors the backward pass
keeps anyway is not kept itself; the backward makes it again when it first needs it.

Shape legend: R rows (batch × tokens), D model dim, F FFN hidden dim.

In a Pre-LN LLaMA block trained with frozen (LoRA) or trained weights, autograd keeps, per layer:
the layer's input x (for the attention norm's backward), the norm's output n = RMSNorm(x) (for
the q/k/v products' weight or adapter gradients), and in the FFN the gate g and up u (for SwiGLU's
backward) and h = SiLU(g) ⊙ u (for the down projection's). n is a function of x and h one of
(g, u): two (R, D) and one (R, F) tensors per layer that are only a few element-wise passes away
from tensors kept anyway — about a third of a LoRA layer's saved activations. Here

    mark(n, fn, x)          records n = fn(x) (on the tensor: nothing is kept by the mark)
    with saving_marked():   autograd saves a marked tensor (or a view of one) as (fn, x); the
                            first backward use computes fn(x) once (no_grad), the later ones
                            (q, k and v each save n) reuse it

The recomputed tensor is the same computation on the same inputs, so the gradients are bit for bit
those of keeping it (tested). A marked tensor must not be changed in place after it is saved (its
recomputation would give the value before the change: autograd would have refused it). Marks are
made only with gradients on and no autocast (which would cast the recomputation differently).

Source: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
§4.2 (selective activation recomputation: keep the products, recompute the cheap operations);
torch.autograd.graph.saved_tensors_hooks.
"""
from __future__ import annotations

import torch

_ATTR = "_attnlab_recompute"  # the attribute a marked tensor carries: its _Recipe


class _Recipe:
    """fn(*inputs), computed at most once (the first unpack), then shared by every later one."""

    __slots__ = ("fn", "inputs", "value")

    def __init__(self, fn, inputs: tuple):
        self.fn, self.inputs, self.value = fn, inputs, None

    def get(self) -> torch.Tensor:
        if self.value is None:
            with torch.no_grad():
                self.value = self.fn(*self.inputs)
        return self.value


def markable(t: torch.Tensor) -> bool:
    """Whether `t` may be marked: gradients on, t part of a graph, no autocast on its device."""
    return torch.is_grad_enabled() and t.requires_grad and not torch.is_autocast_enabled(t.device.type)


def mark(out: torch.Tensor, fn, *inputs: torch.Tensor) -> torch.Tensor:
    """Record that out == fn(*inputs) exactly (module docstring), where markable(out); returns out.
    fn must be deterministic (no dropout) and take no gradient."""
    if markable(out):
        setattr(out, _ATTR, _Recipe(fn, inputs))
    return out


def _pack(t: torch.Tensor):
    recipe = getattr(t, _ATTR, None)
    if recipe is not None:
        return recipe
    base = t._base  # a view of a marked tensor (a reshape a product saves): its geometry
    recipe = None if base is None else getattr(base, _ATTR, None)
    if recipe is not None:
        return recipe, t.size(), t.stride(), t.storage_offset()
    return t


def _unpack(packed) -> torch.Tensor:
    if isinstance(packed, _Recipe):
        return packed.get()
    if isinstance(packed, tuple):
        recipe, size, stride, offset = packed
        return recipe.get().as_strided(size, stride, offset)
    return packed


def saving_marked():
    """Context manager: within it, autograd saves marked tensors as their recipes (module docstring)."""
    return torch.autograd.graph.saved_tensors_hooks(_pack, _unpack)
