"""The fused decode step: one new token of each of N sequences through a whole LLaMA-style decoder
stack in one C++ call.

Shape legend: N sequences, D model dim, H query heads, K kv heads, Dh head dim, V vocabulary,
L layers, S cache rows, C cache capacity, P rows of the RoPE table (positions).

Decoding one token is ~100 small PyTorch operations per layer (norms, RoPE, the KV
cache, attention, residuals), each with the dispatcher's and, on several threads, OpenMP's
fork/join overhead; on a small model that overhead, not the weights' bandwidth, bounds the speed.
`FusedDecoder` runs the same computation in fused_decode.cpp (part of the extension of
nn/quant_kernel.py): RMSNorm, the q|k|v product, RoPE, the KV cache write (into the model's own
KV cache tensors, so PyTorch prefill and fused steps alternate freely; each sequence its own cache
row, length and position), grouped-query attention,
the output projection and residual, RMSNorm, gate|up, SiLU(gate) · up, down and residual for every
layer, then the final norm and the output projection, with threads only around the matrix products.
Weights are read in place: fp32 (nn.Linear) or block-quantized (QuantLinear / QuantEmbedding; the
activations quantized per 32-block exactly as QuantLinear does), each matrix its own kind, biases
allowed. The logits equal the PyTorch path's up to fp32 summation order (tests/nn/test_fused_decode.py),
and a sequence's logits do not depend on the others decoded with it.

What it runs: Pre-LN layers of RMSNorm, self-attention with RoPE and an optional sliding window,
and a SwiGLU FFN, on CPU in fp32 (weights fp32 or quantized), with the C++ kernel available.
`FusedDecoder.build` returns None for anything else, `unsupported` says why; the decode engine
(engines/fused.py) owns the caches and the choice.
Source: llama.cpp's CPU graph of a LLaMA layer (one pass per token over its thread pool).
"""
from __future__ import annotations

import torch
from torch import nn

from attnlab.errors import UserError
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.blocks import TransformerLayer
from attnlab.nn.mlp import SwiGLU
from attnlab.nn.norm import RMSNorm
from attnlab.nn.quant_kernel import SCHEME_ID, kernel
from attnlab.nn.quant_linear import QuantEmbedding, QuantLinear
from attnlab.nn.rope import RotaryEmbedding

F32 = 3                       # the C++ plan's kind of a dense fp32 weight (0..2: SCHEME_ID)
ROPE_ROWS = 256               # RoPE table rows computed at first; doubled when a position is past them


class NotSupported(UserError):
    """What the fused step cannot run (the message says what); the caller keeps the PyTorch path."""


def _weight(module: nn.Module, name: str) -> tuple[int, list[torch.Tensor], torch.Tensor | None, int]:
    """(kind, tensors, bias, tile) of a Linear / Embedding the plan can read in place (tile: the
    quantized weight's layout, nn/quant.py; 0 for fp32).

    Raises:
        NotSupported: another module, dtype or device, or a quantized row of an odd number of blocks.
    """
    if isinstance(module, (QuantLinear, QuantEmbedding)):
        qw = module.qweight
        kind, tensors, tile = SCHEME_ID[qw.scheme], [t for t in (qw.qs, qw.d, qw.m) if t is not None], qw.tile
        if qw.d.shape[1] % 2:
            raise NotSupported(f"{name}: {qw.d.shape[1]} blocks per row (the kernel reads two at a time)")
    elif isinstance(module, (nn.Linear, nn.Embedding)):
        kind, tensors, tile = F32, [module.weight.detach()], 0
        if module.weight.dtype != torch.float32:
            raise NotSupported(f"{name}: {module.weight.dtype} weights (fp32 or block-quantized only)")
    else:
        raise NotSupported(f"{name}: a {type(module).__name__}")
    bias = getattr(module, "bias", None)
    if not all(t.device.type == "cpu" and t.is_contiguous() for t in tensors) or (
            bias is not None and (bias.dtype != torch.float32 or bias.device.type != "cpu")):
        raise NotSupported(f"{name}: weights not contiguous fp32 / block-quantized on the CPU")
    return kind, tensors, None if bias is None else bias.detach().contiguous(), tile


def _norm(module: nn.Module, name: str) -> tuple[torch.Tensor, float]:
    """(gain (D,), eps) of an fp32 RMSNorm on the CPU, else NotSupported."""
    if type(module) is not RMSNorm or module.weight.dtype != torch.float32 or module.weight.device.type != "cpu":
        raise NotSupported(f"{name}: a {type(module).__name__} (an fp32 RMSNorm on the CPU only)")
    return module.weight.detach().contiguous(), float(module.eps)


class FusedDecoder:
    """A decoder stack's weights bound to the C++ plan (built once per engine), and its step.

    Use `FusedDecoder.build(...)`, then `step(...)` for each batch of new tokens.
    Not re-entrant: one step at a time per decoder (it keeps scratch buffers).
    """

    def __init__(self, plan, rotary: RotaryEmbedding):
        self.plan, self.rotary = plan, rotary
        self.cos = self.sin = torch.empty(0, 0)  # (P, Dh) RoPE table, grown on demand

    @classmethod
    def build(cls, *, embed: nn.Module, layers: nn.ModuleList, norm: nn.Module, lm_head: nn.Module,
              rotary: RotaryEmbedding | None) -> FusedDecoder:
        """Bind the plan to a stack.

        Args:
            embed: the token embedding (V, D): nn.Embedding or QuantEmbedding.
            layers: TransformerLayer modules (Pre-LN, RMSNorm, MultiHeadAttention, SwiGLU).
            norm: the final RMSNorm. lm_head: the output projection (V, D), Linear or QuantLinear.
            rotary: the model's RotaryEmbedding (its cos/sin are the ones used); None = the model
                has absolute positions (not supported).
        Raises:
            NotSupported: naming the first thing it cannot run: no C++ kernel here, positions other
                than RoPE, a module of another kind (LayerNorm, a MoE, GELU FFN, cross-attention,
                Post-LN), a weight that is not fp32 or block-quantized on CPU (bf16, another
                device), a quantized row of an odd number of 32-blocks.
        """
        if kernel() != "cpp":
            raise NotSupported("the C++ kernel is not available here (nn/quant_kernel.py)")
        if rotary is None:
            raise NotSupported("absolute (learned / sinusoidal) positions: the step runs RoPE only")
        if not len(layers):
            raise NotSupported("a model without layers")
        first = layers[0].self_attn if isinstance(layers[0], TransformerLayer) else None
        if not isinstance(first, MultiHeadAttention):
            raise NotSupported(f"layers of type {type(layers[0]).__name__}")
        heads, kv_heads, head_dim = first.n_heads, first.n_kv_heads, first.head_dim
        embed_w, head_w, final = _weight(embed, "embed_tokens"), _weight(lm_head, "lm_head"), _norm(norm, "norm")
        if embed_w[2] is not None:
            raise NotSupported("embed_tokens: an embedding with a bias")
        plan = torch.classes.attnlab_decode.DecodePlan(final[0].numel(), heads, kv_heads, head_dim)
        for i, layer in enumerate(layers):
            (attn_norm, attn_eps), qkv, o, (ffn_norm, ffn_eps), gate_up, down = cls._layer_parts(
                layer, f"layers.{i}", heads, kv_heads, head_dim)
            plan.add_layer(attn_norm, attn_eps, [plan.add_linear(*w) for w in qkv], plan.add_linear(*o),
                           ffn_norm, ffn_eps, [plan.add_linear(*w) for w in gate_up], plan.add_linear(*down))
        plan.set_output(plan.add_linear(*embed_w), final[0], final[1], plan.add_linear(*head_w))
        return cls(plan, rotary)

    @staticmethod
    def _layer_parts(layer: nn.Module, name: str, heads: int, kv_heads: int, head_dim: int):
        """The weights of one layer in the plan's order, else NotSupported."""
        if (not isinstance(layer, TransformerLayer) or not layer.pre_norm or layer.cross_attn is not None
                or not isinstance(layer.self_attn, MultiHeadAttention)):
            raise NotSupported(f"{name}: not a Pre-LN self-attention layer")
        if type(layer.ffn) is not SwiGLU:
            raise NotSupported(f"{name}.ffn: a {type(layer.ffn).__name__} (a dense SwiGLU FFN only)")
        attn, ffn = layer.self_attn, layer.ffn
        if (attn.n_heads, attn.n_kv_heads, attn.head_dim) != (heads, kv_heads, head_dim):
            raise NotSupported(f"{name}: heads differ from layer 0's")
        qkv = [_weight(getattr(attn, n), f"{name}.self_attn.{n}") for n in ("q_proj", "k_proj", "v_proj")]
        gate_up = [_weight(getattr(ffn, n), f"{name}.ffn.{n}") for n in ("gate_proj", "up_proj")]
        return (_norm(layer.attn_norm, f"{name}.attn_norm"), qkv, _weight(attn.out_proj, f"{name}.self_attn.out_proj"),
                _norm(layer.ffn_norm, f"{name}.ffn_norm"), gate_up, _weight(ffn.down_proj, f"{name}.ffn.down_proj"))

    def _rope_table(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each (P, Dh) fp32 with P > position: the model's RotaryEmbedding at 0..P−1."""
        if position >= self.cos.shape[0]:
            rows = max(ROPE_ROWS, 2 * self.cos.shape[0], position + 1)
            cos, sin = self.rotary(torch.arange(rows, device=self.rotary.inv_freq.device), torch.float32)
            self.cos, self.sin = cos.reshape(rows, -1).contiguous(), sin.reshape(rows, -1).contiguous()
        return self.cos, self.sin

    def step(self, tokens: list[int], positions: list[int], rows: list[int], slots: list[int], firsts: list[int],
             k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], last_only: bool = False) -> torch.Tensor:
        """Decode one new token of each of N entries: N sequences (a batched step), or N consecutive
        tokens of one sequence (a prefill chunk: one row, consecutive slots), or a mix.

        Args:
            tokens: N token ids. positions: their RoPE positions (>= 0).
            rows: each entry's row of the caches. slots: where in that row its new key and value go
                ((row, slot) pairs distinct). firsts: the oldest visible slot of that row (a sliding
                window), <= slot; an entry sees its row's slots firsts .. slot, the earlier entries of
                the chunk among them.
            k_caches, v_caches: one (S, K, C, Dh) contiguous CPU tensor per layer, written in place,
                all fp32 or all fp16 (keys and values rounded to nearest when written).
            last_only: compute the logits of the last entry only (a prefill chunk).
        Returns:
            (N, V) fp32 logits of each entry's next token, or (1, V) with last_only.
        Raises:
            RuntimeError: a token outside the vocabulary, or arguments of another shape or dtype.
        """
        cos, sin = self._rope_table(max(positions))
        return self.plan.step(tokens, positions, rows, slots, firsts, cos, sin, k_caches, v_caches, last_only)
