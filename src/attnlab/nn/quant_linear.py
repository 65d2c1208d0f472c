"""Linear and embedding layers whose weights stay block-quantized (Q8_0, Q4_0, Q4_1), and the
precisions a model can run at.

Shape legend: R rows (batch × new tokens), I in_features, O out_features, NB = I / 32, V vocabulary,
D embedding dim.
QuantLinear holds qs / d / m (nn/quant.py) as buffers, never an fp32 copy of the weight; its forward
quantizes the activations per 32-block and multiplies in int8 (nn/quant_kernel.py). QuantEmbedding
dequantizes only the looked-up rows. A weight shared by two modules (GPT's tied embedding and output
projection) is quantized once and its buffers shared.
The buffers hold either layout of nn/quant.py (`tile`): a model's weights are prepared once, when
they are quantized or loaded (`prepare`: this machine's kernel layout, nn/cpu_tuning.py quant_tile),
and every reader (the products, the embedding lookup, the fused step, LoRA's merge) takes the layout
into account. A state_dict holds the weights in ggml's rows (layout 0) whatever the module's layout,
and loading one converts the rows into the module's layout: a state_dict saved on one machine loads
on any other (issue 23: a tiled state_dict read as rows would have been silently wrong).
The weights are frozen, but QuantLinear is differentiable in its input (a frozen quantized base
under LoRA adapters, QLoRA): the gradient is ∂L/∂x = ∂L/∂y · Ŵ, a bf16 product with the weight
dequantized again for the backward pass (nothing of it is kept between the two passes).
Source: ggml block formats (ggml-common.h); llama.cpp's CPU matmul (activations as q8_0 / q8_1).
"""
from __future__ import annotations

import torch
from torch import nn

from attnlab.errors import UserError
from attnlab.nn import cpu_tuning
from attnlab.nn.quant import SCHEMES, QuantWeight, check_scheme, dequantize, quantize, take_rows, to_rows, to_tiles
from attnlab.nn.quant_kernel import PREFILL_ROWS, SCHEME_ID, kernel, quant_matmul

FLOAT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
DTYPES = ("auto", *FLOAT_DTYPES, *SCHEMES)  # "auto": as stored (a GGUF file keeps its block types)


def check_dtype(dtype: str) -> str:
    """Return dtype, or raise UserError naming it and the supported ones (a quantization we do
    not implement, e.g. q5_k, is refused here)."""
    if dtype not in DTYPES:
        raise UserError(f"dtype={dtype!r} is not supported; supported: {', '.join(DTYPES)}", param="dtype")
    return dtype


class _QuantBuffers(nn.Module):
    def __init__(self, qw: QuantWeight):
        super().__init__()
        self.scheme, self.tile = qw.scheme, qw.tile
        self.register_buffer("qs", qw.qs)
        self.register_buffer("d", qw.d)
        self.register_buffer("m", qw.m)

    @property
    def qweight(self) -> QuantWeight:
        return QuantWeight(self.scheme, self.qs, self.d, self.m, self.tile)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """qs / d / m in layout 0 (ggml's rows): a state_dict never depends on this machine's tile."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.tile:
            rows = to_rows(self.qweight)
            for name, t in (("qs", rows.qs), ("d", rows.d), ("m", rows.m)):
                if t is not None:
                    destination[prefix + name] = t

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Read qs / d / m in layout 0 (what _save_to_state_dict writes) and store them in this module's
        layout; a missing key or a wrong shape is left to nn.Module's own error (it names the key)."""
        keys = [prefix + n for n in ("qs", "d", "m") if getattr(self, n) is not None]
        if self.tile and all(k in state_dict and state_dict[k].shape == getattr(self, k[len(prefix):]).shape
                             and state_dict[k].dtype == getattr(self, k[len(prefix):]).dtype for k in keys):
            m = state_dict[prefix + "m"] if self.m is not None else None
            tiled = to_tiles(QuantWeight(self.scheme, state_dict[prefix + "qs"], state_dict[prefix + "d"], m), self.tile)
            state_dict = {**state_dict, prefix + "qs": tiled.qs, prefix + "d": tiled.d}
            if m is not None:
                state_dict[prefix + "m"] = tiled.m
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def extra_repr(self) -> str:
        o, i = self.qweight.shape
        return f"{i}, {o}, scheme={self.scheme}" + (f", tile={self.tile}" if self.tile else "")


class QuantLinear(_QuantBuffers):
    """y = x Wᵀ + b with W block-quantized.

    forward: x (..., I) float -> (..., O), x's dtype. Below PREFILL_ROWS rows (decoding) activations
    are quantized per 32-block to int8 (scale max|x| / 127), so the result equals F.linear(x̂, Ŵ) + b
    up to fp32 summation order, where Ŵ = dequantize(W) and x̂ is x rounded to its blocks' int8 grid:
    |y − F.linear(x, Ŵ)| ≤ Σ_b (dx_b / 2) Σ_{i∈b} |Ŵ_oi| per output. From PREFILL_ROWS rows on
    (prefill) it is F.linear(bf16(x), bf16(Ŵ)), rounded to bf16, on CPUs with native bf16 products,
    else F.linear(x, Ŵ) in fp32 (nn/quant_kernel.py, cpu_tuning.prefill_dtype; tests/nn/test_quant.py
    checks each).
    """

    def __init__(self, qw: QuantWeight, bias: torch.Tensor | None = None):
        super().__init__(qw)
        self._fast: bool | None = None
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(torch.float32), requires_grad=False)

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1]

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., I) -> (..., O); differentiable in x (module docstring)."""
        y = _Product.apply(x, self) if torch.is_grad_enabled() and x.requires_grad else self.product(x)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """x Ŵᵀ without the bias, (..., I) -> (..., O), the kernels of the class docstring."""
        if self._fast is None:  # decided once: the C++ kernel takes fp32 CPU rows directly
            self._fast = kernel() == "cpp" and self.qs.device.type == "cpu" and self.d.shape[1] % 2 == 0
        if self._fast and x.dtype == torch.float32 and x.device.type == "cpu" and x.numel() < PREFILL_ROWS * x.shape[-1]:
            y = torch.ops.attnlab_quant.linear(x.reshape(-1, x.shape[-1]), self.qs, self.d, self.m,
                                               SCHEME_ID[self.scheme], self.tile)
            y = y.view(*x.shape[:-1], self.out_features)
        else:
            y = quant_matmul(x, self.qweight)
        return y

    def input_grad(self, grad: torch.Tensor) -> torch.Tensor:
        """∂L/∂x = grad · Ŵ for grad (..., O) -> (..., I), grad's dtype: a bf16 product, Ŵ dequantized
        to bf16 for the call (the C++ kernel's conversion where it is built)."""
        qw = self.qweight
        if kernel() == "cpp" and self.qs.device.type == "cpu":
            w = torch.ops.attnlab_quant.dequantize_bf16(qw.qs, qw.d, qw.m, SCHEME_ID[qw.scheme], qw.tile)
        else:
            w = dequantize(qw).to(torch.bfloat16)
        return (grad.to(torch.bfloat16) @ w).to(grad.dtype)


class _Product(torch.autograd.Function):
    """QuantLinear.product with its input's gradient (QuantLinear.input_grad); the weights get none."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, layer: QuantLinear) -> torch.Tensor:
        ctx.layer = layer
        return layer.product(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.layer.input_grad(grad), None


class QuantEmbedding(_QuantBuffers):
    """Embedding lookup from a block-quantized (V, D) table: forward(ids (...) int64) -> (..., D) fp32,
    the dequantized rows (exactly dequantize(W)[ids])."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return dequantize(take_rows(self.qweight, ids.reshape(-1))).reshape(*ids.shape, -1)


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    *path, leaf = name.split(".")
    module = model
    for p in path:
        module = getattr(module, p)
    return module, leaf


def prepare(qw: QuantWeight) -> QuantWeight:
    """qw in the layout this machine's kernel reads fastest (nn/cpu_tuning.py quant_tile; ggml's rows
    where the C++ kernel is not built or a row has an odd number of blocks): the one conversion of
    a weight, when a model is quantized or loaded. Returns qw itself when it is already so."""
    tile = cpu_tuning.quant_tile(qw.scheme) if kernel() == "cpp" and qw.d.shape[1] % 2 == 0 else 0
    return qw if qw.tile == tile else to_tiles(qw, tile)


def set_quantized(model: nn.Module, name: str, qw: QuantWeight) -> nn.Module:
    """Replace the nn.Linear or nn.Embedding at dotted `name` by its quantized form holding `qw`
    (which must have the old weight's shape; callers pass it through `prepare` once, sharing it
    between tied modules); a Linear keeps its bias. Returns the new module."""
    parent, leaf = _parent(model, name)
    old = getattr(parent, leaf)
    if tuple(old.weight.shape) != qw.shape:
        raise UserError(f"{name}: quantized weight {qw.shape} does not match {tuple(old.weight.shape)}")
    new = QuantEmbedding(qw) if isinstance(old, nn.Embedding) else QuantLinear(qw, old.bias)
    setattr(parent, leaf, new)
    return new


def quantizable(model: nn.Module) -> list[str]:
    """Names of the nn.Linear / nn.Embedding modules whose weights are quantized."""
    return [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Embedding))]


@torch.no_grad()
def quantize_model(model: nn.Module, scheme: str) -> nn.Module:
    """Quantize every nn.Linear and nn.Embedding weight of `model` in place (shared weights once).

    Raises:
        ValueError: an unsupported scheme (named), or a layer whose in-features are not a multiple
            of 32 (named, with its shape).
    """
    check_scheme(scheme)
    names = quantizable(model)
    for name in names:
        w = model.get_submodule(name).weight
        if w.shape[1] % 32:
            raise UserError(f"{scheme} needs every weight's last dimension to be a multiple of 32; "
                            f"{name} has shape {tuple(w.shape)}")
    done: dict[int, QuantWeight] = {}
    for name in names:
        w = model.get_submodule(name).weight
        if id(w) not in done:
            done[id(w)] = prepare(quantize(w, scheme))
        set_quantized(model, name, done[id(w)])
    return model


def quantized_bytes(model: nn.Module) -> int:
    """Bytes of all parameters and buffers, shared tensors once (what decoding one token reads,
    give or take the embedding rows)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def set_dtype(model: nn.Module, dtype: str) -> nn.Module:
    """Run `model` at `dtype`: "auto" / "fp32" leave fp32 weights as they are, "bf16" casts, a scheme
    quantizes every Linear / Embedding (quantize_model). Returns the model (changed in place).

    Raises:
        ValueError: an unsupported dtype (named, listing DTYPES) or a shape a scheme cannot hold.
    """
    check_dtype(dtype)
    if dtype == "bf16":
        return model.to(torch.bfloat16)
    if dtype in SCHEMES:
        return quantize_model(model, dtype)
    return model
