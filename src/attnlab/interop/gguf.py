"""llama.cpp GGUF files of LLaMA-architecture models (e.g. SmolLM2) loaded into models.gpt.GPT.

Shape legend: V vocabulary, D model dim, F FFN hidden size, H query heads, K key/value heads,
Dh head dim, I input features of a weight.
GGUF tensor names -> ours (N = layer):
    token_embd / output_norm / output          embed_tokens / norm / lm_head (absent: tied)
    blk.N.attn_{q,k,v,output}                  layers.N.self_attn.{q,k,v,out}_proj
    blk.N.ffn_{gate,up,down}                   layers.N.ffn.{gate,up,down}_proj
    blk.N.attn_norm / blk.N.ffn_norm           layers.N.attn_norm / layers.N.ffn_norm
GGUF lists a tensor's dims innermost first (ggml's ne): a weight of ne [I, O] is our (O, I).
Q/K rows: llama.cpp rotates interleaved pairs (2i, 2i+1) of a head, we rotate (i, i + Dh/2) as
HF LLaMA does. Its convert_hf_to_gguf.py therefore stores q_proj / k_proj with each head's rows
reordered: W.reshape(H, 2, Dh/2, I).swapaxes(1, 2), which moves HF row h·Dh + j·Dh/2 + i (half j,
pair i) to GGUF row h·Dh + 2i + j. `unpermute_qk` applies the inverse (K heads for k_proj).
Sources: GGUF specification (ggml docs/gguf.md); llama.cpp convert_hf_to_gguf.py
(LlamaModel.permute) and src/llama-model.cpp (LLM_ARCH_LLAMA hyper-parameters).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import torch

from attnlab.errors import UserError
from attnlab.interop.gguf_quants import TYPES, dequantize, from_gguf_blocks
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn.quant import SCHEMES, QuantWeight, quantize
from attnlab.nn.quant_linear import check_dtype, prepare, set_dtype, set_quantized
from attnlab.tokenizers.bpe import ByteLevelBPE
from attnlab.tokenizers.gguf import tokenizer_from_metadata

__all__ = ["dequantize", "unpermute_qk", "gpt_config_from_gguf", "gguf_tensor_names", "load_gguf"]

SUPPORTED_ARCHITECTURES = ("llama",)
# "{arch}.<key>" hyper-parameters read into GPTConfig, and those only checked (see _check_keys).
_READ = ("block_count", "context_length", "embedding_length", "feed_forward_length",
         "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
         "rope.freq_base")
_CHECKED = ("vocab_size", "rope.dimension_count", "attention.key_length",
            "attention.value_length", "rope.scaling.type", "rope.scaling.factor", "expert_count",
            "expert_used_count")
_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.out_proj", "ffn_gate": "ffn.gate_proj", "ffn_up": "ffn.up_proj",
          "ffn_down": "ffn.down_proj", "attn_norm": "attn_norm", "ffn_norm": "ffn_norm"}
_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's row permutation of a q_proj (n_heads = H) or k_proj (n_heads = K) weight.

    Args:
        w: (H·Dh, I) float weight as stored in the GGUF (rows interleaved per head).
        n_heads: H for attn_q, K for attn_k.
    Returns:
        (H·Dh, I), rows in HF / rotate-half order (a new array).
    Source: inverse of convert_hf_to_gguf.py LlamaModel.permute (see the module doc).
    """
    rows = w.shape[0]
    return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])  # (H, Dh/2, 2, I)
            .swapaxes(1, 2)  # (H, 2, Dh/2, I)
            .reshape(w.shape).copy())


def _get(metadata: Mapping[str, Any], key: str, kind: type, default=None):
    value = metadata.get(key, default)
    if value is None:
        raise UserError(f"GGUF metadata key {key} is missing")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise UserError(f"GGUF metadata key {key} must be a {kind.__name__}, got {value!r}")
    return value


def _check_keys(metadata: Mapping[str, Any], arch: str, head_dim: int, vocab: int) -> None:
    """Refuse any "{arch}." key that would change the math in a way GPT does not implement."""
    allowed = {"vocab_size": vocab, "rope.dimension_count": head_dim, "attention.key_length": head_dim,
               "attention.value_length": head_dim, "rope.scaling.type": "none",
               "rope.scaling.factor": 1.0, "expert_count": 0, "expert_used_count": 0}
    for key, value in metadata.items():
        if not key.startswith(arch + "."):
            continue
        sub = key[len(arch) + 1:]
        if sub in _READ:
            continue
        if sub not in _CHECKED:
            raise UserError(f"GGUF metadata key {key} = {value!r} is not supported (attnlab reads "
                            f"{', '.join(_READ + _CHECKED)})")
        if value != allowed[sub]:
            raise UserError(f"GGUF metadata key {key} = {value!r} is not supported: attnlab's GPT "
                            f"needs {allowed[sub]!r} (no RoPE scaling, partial rotary, odd head "
                            f"sizes or experts)")


def gpt_config_from_gguf(metadata: Mapping[str, Any], tensor_names: Iterable[str] | None = None
                         ) -> GPTConfig:
    """The GPTConfig of a GGUF "llama" model.

    Args:
        metadata: key -> value, as tokenizers.gguf.read_gguf_metadata (or load_gguf) gives.
        tensor_names: the file's tensor names; the embeddings are tied when "output.weight" is
            not among them (llama.cpp then reuses token_embd). None = assume tied.
    Returns:
        GPTConfig with RoPE, RMSNorm, SwiGLU, no biases (the "llama" preset), the file's sizes,
        rope_theta (default 10,000), norm_eps, max_seq_len = context_length, vocab_size = the
        number of tokens, bos_id / eos_id from tokenizer.ggml.{bos,eos}_token_id.
    Raises:
        ValueError: an unsupported general.architecture (naming it), a missing or mistyped key
            (naming it), or a key that changes the math (RoPE scaling, partial rotary dims,
            experts, an unknown "{arch}." key), naming the key.
    """
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UserError(f"GGUF general.architecture {arch!r} is not supported; supported: "
                        f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise UserError("GGUF metadata key tokenizer.ggml.tokens is missing (it gives vocab_size)")
    n_heads = _get(metadata, f"{arch}.attention.head_count", int)
    d_model = _get(metadata, f"{arch}.embedding_length", int)
    _check_keys(metadata, arch, d_model // n_heads if n_heads else 0, len(tokens))
    ids = {k: metadata.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos")}
    tied = True if tensor_names is None else "output.weight" not in set(tensor_names)
    return GPTConfig.from_name(
        "llama", vocab_size=len(tokens), d_model=d_model, n_heads=n_heads,
        n_layers=_get(metadata, f"{arch}.block_count", int),
        n_kv_heads=_get(metadata, f"{arch}.attention.head_count_kv", int, n_heads),
        d_ff=_get(metadata, f"{arch}.feed_forward_length", int),
        max_seq_len=_get(metadata, f"{arch}.context_length", int),
        rope_theta=_get(metadata, f"{arch}.rope.freq_base", float, 10000.0),
        norm_eps=_get(metadata, f"{arch}.attention.layer_norm_rms_epsilon", float),
        tie_embeddings=tied, bos_id=ids["bos"], eos_id=ids["eos"])


def gguf_tensor_names(n_layers: int, tied: bool) -> dict[str, str]:
    """GGUF tensor name -> our state-dict name, for every tensor a llama file must hold."""
    names = {f"{g}.weight": f"{ours}.weight" for g, ours in _TOP.items() if not (tied and g == "output")}
    for i in range(n_layers):
        names.update({f"blk.{i}.{g}.weight": f"layers.{i}.{ours}.weight" for g, ours in _LAYER.items()})
    return names


def _read_header(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise UserError(f"{path} is not a GGUF file: it starts with {magic!r}, not b'GGUF' "
                        "(refused before parsing)")


def _check_tensors(found: Mapping[str, Any], names: Mapping[str, str], own: Mapping[str, torch.Tensor]) -> None:
    problems = [f"unexpected {n} {tuple(int(d) for d in reversed(t.shape))}"
                for n, t in found.items() if n not in names]
    problems += [f"missing {g} {tuple(own[ours].shape)}" for g, ours in names.items() if g not in found]
    for g, ours in names.items():
        if g in found and tuple(int(d) for d in reversed(found[g].shape)) != tuple(own[ours].shape):
            problems.append(f"{g} has shape {tuple(int(d) for d in reversed(found[g].shape))}, "
                            f"expected {tuple(own[ours].shape)}")
    if problems:
        raise UserError("GGUF tensors do not match the config: " + "; ".join(problems))


def _target(tensor, dtype: str) -> str | None:
    """The block scheme a weight matrix is held in at `dtype` (None = a float tensor)."""
    if len(tensor.shape) != 2:
        return None  # norms stay fp32
    if dtype in SCHEMES:
        return dtype
    kind = TYPES.get(int(tensor.tensor_type), ("other", 0))[0].lower()
    if dtype != "auto" or kind in ("f32", "f16", "bf16"):
        return None
    return kind if kind in SCHEMES else "q8_0"  # K-quants and the rest: re-quantized to Q8_0


def _quantized(tensor, g: str, scheme: str, shape, n_heads: int | None) -> QuantWeight:
    """One GGUF weight as a QuantWeight of `scheme`: its blocks as they are when the file already
    holds that type, else dequantized and re-quantized; Q/K rows un-permuted (blocks lie in rows)."""
    if TYPES.get(int(tensor.tensor_type), ("?", 0))[0].lower() == scheme:
        qw = from_gguf_blocks(tensor.data, scheme, tuple(shape))
    else:
        qw = quantize(torch.from_numpy(dequantize(tensor.data, tensor.tensor_type, shape, g)), scheme)
    if n_heads is None:
        return qw
    rows = torch.from_numpy(unpermute_qk(np.arange(shape[0])[:, None], n_heads)[:, 0])
    return QuantWeight(scheme, qw.qs[rows], qw.d[rows], None if qw.m is None else qw.m[rows])


def _check_finite(name: str, *values) -> None:
    """Raise ValueError naming GGUF tensor `name` when its values (numpy arrays or tensors: float
    data, or a block format's scales) hold NaN or ±inf: a damaged file (nothing non-finite loads)."""
    bad = sum(int((~np.isfinite(np.asarray(v, dtype=np.float32))).sum()) for v in values if v is not None)
    if bad:
        raise ValueError(f"tensor {name!r} holds {bad} non-finite values (the file is damaged)")


def _load_weights(reader, model: GPT, tied: bool, dtype: str) -> None:
    """Check names and shapes, then fill `model`: float tensors dequantized into our names and
    layout; at a quantized dtype the weight matrices as QuantLinear / QuantEmbedding modules."""
    cfg = model.cfg
    names = gguf_tensor_names(cfg.n_layers, tied)
    own = model.state_dict()
    found = {t.name: t for t in reader.tensors}
    _check_tensors(found, names, own)
    state, quantized = {}, {}
    for g, ours in names.items():
        t = found[g]
        heads = cfg.n_heads if ".attn_q." in g else cfg.kv_heads if ".attn_k." in g else None
        scheme = _target(t, dtype)
        if scheme is not None:
            qw = _quantized(t, g, scheme, own[ours].shape, heads)
            _check_finite(g, qw.d, qw.m)
            quantized[ours] = prepare(qw)  # the kernel's layout, once
            continue
        w = dequantize(t.data, t.tensor_type, own[ours].shape, g)
        _check_finite(g, w)
        state[ours] = torch.from_numpy(w if heads is None else unpermute_qk(w, heads))
    if tied:
        if "embed_tokens.weight" in quantized:
            quantized["lm_head.weight"] = quantized["embed_tokens.weight"]
        else:
            state["lm_head.weight"] = state["embed_tokens.weight"]
    missing, _ = model.load_state_dict(state, strict=False)
    assert set(missing) <= set(quantized), missing
    for ours, qw in quantized.items():
        set_quantized(model, ours.removesuffix(".weight"), qw)


def load_gguf(path, dtype: str = "fp32") -> tuple[GPT, ByteLevelBPE, dict[str, Any]]:
    """Load a llama.cpp GGUF model file: weights, hyper-parameters and tokenizer.

    Args:
        path: a .gguf file of general.architecture "llama" (e.g. tokenizers.gguf.find_smollm2_gguf()).
        dtype: "fp32" (every tensor dequantized: the reference), "bf16", "auto" (the file's Q8_0 /
            Q4_0 / Q4_1 matrices stay as they are, in QuantLinear / QuantEmbedding modules; other
            quantized matrices, such as the K-quants Q4_K / Q6_K, which attnlab has no kernel for,
            dequantized and re-quantized to Q8_0; float tensors fp32), or "q8_0" / "q4_0" / "q4_1" (every matrix held in that type: kept as stored when
            the file has it, else dequantized and re-quantized one tensor at a time).
    Returns:
        (model, tokenizer, metadata): a GPT in eval mode (Q/K rows un-permuted); the byte-level BPE of the file (encode(text, "all") matches control tokens
        such as <|im_start|>); every metadata key -> value (tokenizer.chat_template included).
    Raises:
        FileNotFoundError: no such file.
        ValueError: the file does not start with the GGUF magic (checked before any parsing), it
            is malformed, its architecture or a hyper-parameter is unsupported (named), dtype is
            not one of nn.quant_linear.DTYPES (named), its
            tokenizer is not byte-level BPE, or tensors are missing, unexpected or mis-shaped
            (listed with their shapes), use an unsupported type, or hold NaN / ±inf (named).
        ImportError: the `gguf` package is not installed (`pip install 'attnlab[hf]'`).
    """
    path = Path(path)
    check_dtype(dtype)
    _read_header(path)
    try:
        from gguf import GGUFReader  # optional dependency (the hf extra)
    except ImportError as err:
        raise ImportError("reading GGUF needs the `gguf` package: pip install 'attnlab[hf]'") from err
    try:
        reader = GGUFReader(str(path), "r")
        metadata = {n: f.contents() for n, f in reader.fields.items() if not n.startswith("GGUF.")}
    except (ValueError, IndexError, UnicodeDecodeError, OSError) as err:
        raise UserError(f"{path}: not a valid GGUF file ({err})") from None
    try:
        cfg = gpt_config_from_gguf(metadata, [t.name for t in reader.tensors])
        tokenizer = tokenizer_from_metadata(metadata).tokenizer
        model = GPT.for_loading(cfg)
        _load_weights(reader, model, cfg.tie_embeddings, dtype)
    except ValueError as err:
        raise UserError(f"{path}: {err}") from None
    return set_dtype(model, "bf16" if dtype == "bf16" else "fp32").eval(), tokenizer, metadata
