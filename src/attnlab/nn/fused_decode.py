"""The fused decode step: one new token through a whole LLaMA-style decoder stack in one C++ call.

Shape legend: D model dim, H query heads, K kv heads, Dh head dim, V vocabulary, L layers,
P rows of the RoPE table (positions).

Decoding one token at batch 1 is ~100 small PyTorch operations per layer (norms, RoPE, the KV
cache, attention, residuals), each with the dispatcher's and, on several threads, OpenMP's
fork/join overhead; on a small model that overhead, not the weights' bandwidth, bounds the speed.
`FusedDecoder` runs the same computation in fused_decode.cpp (part of the extension of
nn/quant_kernel.py): RMSNorm, the q|k|v product, RoPE, the KV cache write (into the model's own
KVCache tensors, so PyTorch prefill and fused steps alternate freely), grouped-query attention,
the output projection and residual, RMSNorm, gate|up, SiLU(gate) · up, down and residual for every
layer, then the final norm and the output projection, with threads only around the matrix products.
Weights are read in place: fp32 (nn.Linear) or block-quantized (QuantLinear / QuantEmbedding; the
activations quantized per 32-block exactly as QuantLinear does), each matrix its own kind, biases
allowed. The logits equal the PyTorch path's up to fp32 summation order (tests/nn/test_fused_decode.py).

What it runs: Pre-LN layers of RMSNorm, self-attention with RoPE and an optional sliding window,
and a SwiGLU FFN, on CPU in fp32 (weights fp32 or quantized), with the C++ kernel available.
`FusedDecoder.build` returns None for anything else (and the caller takes the PyTorch path);
ATTNLAB_FUSED_DECODE=0 turns it off.
Source: llama.cpp's CPU graph of a LLaMA layer (one pass per token over its thread pool).
"""
from __future__ import annotations

import os

import torch
from torch import nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.blocks import TransformerLayer
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.mlp import SwiGLU
from attnlab.nn.norm import RMSNorm
from attnlab.nn.quant_kernel import SCHEME_ID, kernel
from attnlab.nn.quant_linear import QuantEmbedding, QuantLinear
from attnlab.nn.rope import RotaryEmbedding

ENV = "ATTNLAB_FUSED_DECODE"  # "0" turns the fused step off
F32 = 3                       # the C++ plan's kind of a dense fp32 weight (0..2: SCHEME_ID)
ROPE_ROWS = 256               # RoPE table rows computed at first; doubled when a position is past them


def enabled() -> bool:
    """False when the environment sets ATTNLAB_FUSED_DECODE=0."""
    return os.environ.get(ENV, "1") != "0"


def _weight(module: nn.Module) -> tuple[int, list[torch.Tensor], torch.Tensor | None] | None:
    """(kind, tensors, bias) of a Linear / Embedding the plan can read in place, or None."""
    if isinstance(module, (QuantLinear, QuantEmbedding)):
        qw = module.qweight
        kind, tensors = SCHEME_ID[qw.scheme], [t for t in (qw.qs, qw.d, qw.m) if t is not None]
        ok = qw.d.shape[1] % 2 == 0  # the kernel reads two 32-blocks per vector
    elif isinstance(module, (nn.Linear, nn.Embedding)):
        kind, tensors = F32, [module.weight.detach()]
        ok = module.weight.dtype == torch.float32
    else:
        return None
    bias = getattr(module, "bias", None)
    ok = ok and all(t.device.type == "cpu" and t.is_contiguous() for t in tensors) and (
        bias is None or (bias.dtype == torch.float32 and bias.device.type == "cpu"))
    return (kind, tensors, None if bias is None else bias.detach().contiguous()) if ok else None


def _norm(module: nn.Module) -> tuple[torch.Tensor, float] | None:
    """(gain (D,), eps) of an fp32 RMSNorm, or None."""
    if type(module) is not RMSNorm or module.weight.dtype != torch.float32 or module.weight.device.type != "cpu":
        return None
    return module.weight.detach().contiguous(), float(module.eps)


class FusedDecoder:
    """A decoder stack's weights bound to the C++ plan (built once per generation), and its step.

    Use `FusedDecoder.build(...)`, then `step(token, position, caches)` for each new token.
    Not re-entrant: one step at a time per decoder (it keeps scratch buffers).
    """

    def __init__(self, plan, rotary: RotaryEmbedding, window: int | None):
        self.plan, self.rotary, self.window = plan, rotary, window
        self.cos = self.sin = torch.empty(0, 0)  # (P, Dh) RoPE table, grown on demand

    @classmethod
    def build(cls, *, embed: nn.Module, layers: nn.ModuleList, norm: nn.Module, lm_head: nn.Module,
              rotary: RotaryEmbedding, window: int | None, caches: list[KVCache]) -> FusedDecoder | None:
        """Bind the plan to a stack, or return None where it cannot run it (the caller then keeps
        the PyTorch path): a module of another kind (LayerNorm, a MoE, GELU FFN, cross-attention,
        Post-LN), a weight that is not fp32 or block-quantized on CPU (bf16, another device), a
        quantized row of an odd number of 32-blocks, caches that are not fp32 on CPU for one
        sequence, or no C++ kernel here.

        Args:
            embed: the token embedding (V, D): nn.Embedding or QuantEmbedding.
            layers: TransformerLayer modules (Pre-LN, RMSNorm, MultiHeadAttention, SwiGLU).
            norm: the final RMSNorm. lm_head: the output projection (V, D), Linear or QuantLinear.
            rotary: the model's RotaryEmbedding (its cos/sin are the ones used).
            window: the sliding window W (attend to the W most recent positions), or None.
            caches: the layers' KVCaches the steps will append to.
        """
        if kernel() != "cpp" or not len(layers) or any(
                c.k.dtype != torch.float32 or c.k.device.type != "cpu" or c.k.shape[0] != 1 for c in caches):
            return None
        first = layers[0].self_attn if isinstance(layers[0], TransformerLayer) else None
        if not isinstance(first, MultiHeadAttention):
            return None
        heads, kv_heads, head_dim = first.n_heads, first.n_kv_heads, first.head_dim
        embed_w, head_w, final = _weight(embed), _weight(lm_head), _norm(norm)
        if embed_w is None or head_w is None or final is None or embed_w[2] is not None:
            return None
        plan = torch.classes.attnlab_decode.DecodePlan(final[0].numel(), heads, kv_heads, head_dim)
        for layer in layers:
            parts = cls._layer_parts(layer, heads, kv_heads, head_dim)
            if parts is None:
                return None
            (attn_norm, attn_eps), qkv, o, (ffn_norm, ffn_eps), gate_up, down = parts
            plan.add_layer(attn_norm, attn_eps, [plan.add_linear(*w) for w in qkv], plan.add_linear(*o),
                           ffn_norm, ffn_eps, [plan.add_linear(*w) for w in gate_up], plan.add_linear(*down))
        plan.set_output(plan.add_linear(*embed_w), final[0], final[1], plan.add_linear(*head_w))
        return cls(plan, rotary, window)

    @staticmethod
    def _layer_parts(layer: nn.Module, heads: int, kv_heads: int, head_dim: int):
        """The weights of one layer in the plan's order, or None for a layer it cannot run."""
        if (not isinstance(layer, TransformerLayer) or not layer.pre_norm or layer.cross_attn is not None
                or not isinstance(layer.self_attn, MultiHeadAttention) or type(layer.ffn) is not SwiGLU):
            return None
        attn, ffn = layer.self_attn, layer.ffn
        if (attn.n_heads, attn.n_kv_heads, attn.head_dim) != (heads, kv_heads, head_dim):
            return None
        qkv = [_weight(m) for m in _fused_or_separate(attn.q_proj, attn.k_proj, attn.v_proj)]
        gate_up = [_weight(m) for m in _fused_or_separate(ffn.gate_proj, ffn.up_proj)]
        rest = [_norm(layer.attn_norm), _weight(attn.out_proj), _norm(layer.ffn_norm), _weight(ffn.down_proj)]
        if any(p is None for p in qkv + gate_up + rest):
            return None
        return rest[0], qkv, rest[1], rest[2], gate_up, rest[3]

    def _rope_table(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each (P, Dh) fp32 with P > position: the model's RotaryEmbedding at 0..P−1."""
        if position >= self.cos.shape[0]:
            rows = max(ROPE_ROWS, 2 * self.cos.shape[0], position + 1)
            cos, sin = self.rotary(torch.arange(rows, device=self.rotary.inv_freq.device), torch.float32)
            self.cos, self.sin = cos.reshape(rows, -1).contiguous(), sin.reshape(rows, -1).contiguous()
        return self.cos, self.sin

    def step(self, token: int, position: int, caches: list[KVCache]) -> torch.Tensor:
        """Decode one token: append its keys/values to every layer's cache and return the logits.

        Args:
            token: the new token's id. position: its RoPE position (>= 0).
            caches: one fp32 KVCache per layer, batch 1, on CPU, all at the same length.
        Returns:
            (V,) fp32 logits of the next token.
        Raises:
            ValueError: when the caches would overflow (as KVCache.update).
            RuntimeError: a token outside the vocabulary, or caches of another shape or dtype.
        """
        for cache in caches:
            cache.reserve(1)
        cos, sin = self._rope_table(position)
        slot = caches[0].length - caches[0].start  # where the new key goes
        first = 0 if self.window is None else max(0, slot + 1 - self.window)  # the oldest visible slot
        logits = self.plan.step(token, position, cos, sin, [c.k for c in caches], [c.v for c in caches], slot, first)
        for cache in caches:
            cache.length += 1
        return logits


def _fused_or_separate(*layers: nn.Module) -> list[nn.Module]:
    """[the fused group's QuantLinear] when fuse_quantized joined exactly these layers, else the layers."""
    group = getattr(layers[0], "fused_group", None)
    if group is not None and len(group[1]) == len(layers) and all(a is b for a, b in zip(group[1], layers)):
        return [group[0]]
    return list(layers)
