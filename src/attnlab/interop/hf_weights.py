"""Tensor names and layouts: attnlab's GPT state dict <-> Hugging Face checkpoints.

Shape legend: V vocab, D model dim, F FFN (or expert) hidden dim, P positions (max_seq_len),
H query heads, K key/value heads, Dh head dim, E experts.

LLaMA / Mistral / Qwen2 / Mixtral use nn.Linear (out, in) weights like ours and differ only in names
(_ROPE_NAMES). GPT-2 uses Conv1D, whose weights are stored (in, out), the transpose of ours, and a
fused query/key/value projection c_attn: (D, 3D) = [W_q; W_k; W_v]ᵀ. Mixtral checkpoints keep one
tensor per expert (block_sparse_moe.experts.E.w1/w2/w3 = gate/down/up), which is what transformers 5
writes with save_pretrained although it holds the experts fused in memory; the fused layout
(mlp.experts.gate_up_proj (E, 2F, D), mlp.experts.down_proj (E, D, F), mlp.gate) is read too.
With tied embeddings there is no lm_head.weight in the checkpoint.

to_hf() is the single source of truth: the tensor names and shapes a checkpoint must hold are
to_hf() of a freshly built GPT's state dict; from_hf() is its inverse.
"""
from __future__ import annotations

import re
from typing import Iterable

import torch

from attnlab.errors import UserError
from attnlab.interop.hf_config import GPT2, MIXTRAL

_L = r"layers\.(\d+)\."
_ROPE_NAMES = [  # (our name, HF name) as a regex and its replacement
    (r"embed_tokens\.weight", "model.embed_tokens.weight"),
    (r"norm\.weight", "model.norm.weight"),
    (r"lm_head\.weight", "lm_head.weight"),
    (_L + r"attn_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
    (_L + r"ffn_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
    (_L + r"self_attn\.([qkv])_proj\.(weight|bias)", r"model.layers.\1.self_attn.\2_proj.\3"),
    (_L + r"self_attn\.out_proj\.(weight|bias)", r"model.layers.\1.self_attn.o_proj.\2"),
    (_L + r"ffn\.(gate|up|down)_proj\.(weight|bias)", r"model.layers.\1.mlp.\2_proj.\3"),
    (_L + r"ffn\.router\.weight", r"model.layers.\1.block_sparse_moe.gate.weight"),
    (_L + r"ffn\.experts\.(\d+)\.gate_proj\.weight", r"model.layers.\1.block_sparse_moe.experts.\2.w1.weight"),
    (_L + r"ffn\.experts\.(\d+)\.down_proj\.weight", r"model.layers.\1.block_sparse_moe.experts.\2.w2.weight"),
    (_L + r"ffn\.experts\.(\d+)\.up_proj\.weight", r"model.layers.\1.block_sparse_moe.experts.\2.w3.weight"),
]
_GPT2_NAMES = [  # (our name, HF name, stored transposed)
    (r"embed_tokens\.weight", "transformer.wte.weight", False),
    (r"embed_positions\.weight", "transformer.wpe.weight", False),
    (r"norm\.(weight|bias)", r"transformer.ln_f.\1", False),
    (r"lm_head\.weight", "lm_head.weight", False),
    (_L + r"attn_norm\.(weight|bias)", r"transformer.h.\1.ln_1.\2", False),
    (_L + r"ffn_norm\.(weight|bias)", r"transformer.h.\1.ln_2.\2", False),
    (_L + r"self_attn\.out_proj\.weight", r"transformer.h.\1.attn.c_proj.weight", True),
    (_L + r"self_attn\.out_proj\.bias", r"transformer.h.\1.attn.c_proj.bias", False),
    (_L + r"ffn\.up_proj\.weight", r"transformer.h.\1.mlp.c_fc.weight", True),
    (_L + r"ffn\.up_proj\.bias", r"transformer.h.\1.mlp.c_fc.bias", False),
    (_L + r"ffn\.down_proj\.weight", r"transformer.h.\1.mlp.c_proj.weight", True),
    (_L + r"ffn\.down_proj\.bias", r"transformer.h.\1.mlp.c_proj.bias", False),
]
_GPT2_QKV = re.compile(_L + r"self_attn\.([qkv])_proj\.(weight|bias)")
# Buffers some checkpoints carry that are not parameters: GPT-2's causal-mask tables, RoPE frequencies.
_IGNORED = re.compile(r".*(\.attn\.bias|\.attn\.masked_bias|rotary_emb\.inv_freq)")


def hf_name(arch: str, name: str) -> tuple[str, bool]:
    """(HF tensor name, stored transposed?) of one of our state-dict names (not GPT-2's q/k/v).

    Raises:
        KeyError: for a name with no counterpart in `arch`.
    """
    table = _GPT2_NAMES if arch == GPT2 else [(p, r, False) for p, r in _ROPE_NAMES]
    for pattern, replacement, transposed in table:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, replacement, name), transposed
    raise KeyError(f"{name} has no {arch} counterpart")


def to_hf(arch: str, state: dict[str, torch.Tensor], tie: bool) -> dict[str, torch.Tensor]:
    """Our state dict -> the Hugging Face tensors of `arch` (contiguous; lm_head left out when tied).

    GPT-2's c_attn weight (D, 3D) = cat(W_q, W_k, W_v)ᵀ, its bias (3D,) = cat(b_q, b_k, b_v).
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if (tie and name == "lm_head.weight") or (arch == GPT2 and _GPT2_QKV.fullmatch(name)):
            continue
        target, transposed = hf_name(arch, name)
        out[target] = tensor.T if transposed else tensor
    if arch == GPT2:
        n_layers = len({m.group(1) for m in map(_GPT2_QKV.fullmatch, state) if m})
        for i in range(n_layers):
            for kind in ("weight", "bias"):
                q, k, v = (state[f"layers.{i}.self_attn.{p}_proj.{kind}"] for p in "qkv")
                fused = torch.cat([q, k, v], dim=0)  # (3D, D) or (3D,)
                out[f"transformer.h.{i}.attn.c_attn.{kind}"] = fused.T if kind == "weight" else fused
    return {k: v.detach().contiguous() for k, v in out.items()}


def from_hf(arch: str, tensors: dict[str, torch.Tensor], our_names: Iterable[str], tie: bool
            ) -> dict[str, torch.Tensor]:
    """Hugging Face tensors (already checked by check_tensors) -> our state dict, for `our_names`."""
    ours: dict[str, torch.Tensor] = {}
    for name in our_names:
        if tie and name == "lm_head.weight":
            continue
        qkv = _GPT2_QKV.fullmatch(name) if arch == GPT2 else None
        if qkv:
            layer, part, kind = qkv.groups()
            fused = tensors[f"transformer.h.{layer}.attn.c_attn.{kind}"]
            fused = fused.T if kind == "weight" else fused  # (3D, D) or (3D,)
            ours[name] = fused.chunk(3, dim=0)["qkv".index(part)]
            continue
        source, transposed = hf_name(arch, name)
        ours[name] = tensors[source].T if transposed else tensors[source]
    if tie:
        ours["lm_head.weight"] = ours["embed_tokens.weight"]
    return ours


def _unfuse_mixtral(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5's in-memory Mixtral layout -> one tensor per expert (what save_pretrained writes)."""
    out = {}
    for name, t in tensors.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.mlp\.(experts\.gate_up_proj|experts\.down_proj|gate\.weight)", name)
        moe = f"model.layers.{m.group(1)}.block_sparse_moe" if m else ""
        if m and m.group(2) == "gate.weight":
            out[f"{moe}.gate.weight"] = t
        elif m and m.group(2) == "experts.gate_up_proj" and t.dim() == 3 and t.shape[1] % 2 == 0:
            gate, up = t.chunk(2, dim=1)  # (E, F, D) each
            for e in range(t.shape[0]):
                out[f"{moe}.experts.{e}.w1.weight"], out[f"{moe}.experts.{e}.w3.weight"] = gate[e], up[e]
        elif m and m.group(2) == "experts.down_proj" and t.dim() == 3:
            for e in range(t.shape[0]):
                out[f"{moe}.experts.{e}.w2.weight"] = t[e]  # (D, F)
        else:
            out[name] = t
    return out


def normalize(arch: str, tensors: dict[str, torch.Tensor], tie: bool) -> dict[str, torch.Tensor]:
    """Bring a checkpoint's tensors to the names to_hf() writes: drop buffers, add GPT-2's
    "transformer." prefix where an old checkpoint lacks it, split fused Mixtral experts, and drop a
    tied lm_head.weight that repeats the embeddings.

    Raises:
        ValueError: when tied embeddings are declared but lm_head.weight differs from them.
    """
    tensors = {k: v for k, v in tensors.items() if not _IGNORED.fullmatch(k)}
    if arch == GPT2 and not any(k.startswith("transformer.") for k in tensors):
        tensors = {k if k == "lm_head.weight" else "transformer." + k: v for k, v in tensors.items()}
    if arch == MIXTRAL:
        tensors = _unfuse_mixtral(tensors)
    embed = "transformer.wte.weight" if arch == GPT2 else "model.embed_tokens.weight"
    if tie and "lm_head.weight" in tensors and embed in tensors:
        head = tensors.pop("lm_head.weight")
        if head.shape != tensors[embed].shape or not torch.equal(head, tensors[embed]):
            raise UserError("tie_word_embeddings is true but lm_head.weight differs from the token embeddings")
    return tensors


def _listing(items: list[str], limit: int = 8) -> str:
    more = f" … and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def check_tensors(expected: dict[str, tuple], found: dict[str, tuple], where: str) -> None:
    """Compare a checkpoint's tensor names and shapes with those the config needs.

    Raises:
        ValueError: listing the missing, unexpected and mis-shaped tensors with their shapes.
    """
    missing = [f"{k} {expected[k]}" for k in sorted(expected.keys() - found.keys())]
    unexpected = [f"{k} {found[k]}" for k in sorted(found.keys() - expected.keys())]
    shaped = [f"{k} is {found[k]}, config.json needs {expected[k]}" for k in sorted(expected.keys() & found.keys())
              if tuple(found[k]) != tuple(expected[k])]
    parts = [f"{label}: {_listing(items)}" for label, items in (("missing tensors", missing),
             ("unexpected tensors", unexpected), ("wrong shapes", shaped)) if items]
    if parts:
        raise UserError(f"{where} does not match its config.json; " + "; ".join(parts))
