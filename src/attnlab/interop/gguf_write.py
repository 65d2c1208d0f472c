"""Writing a LLaMA-family GPT (RoPE, RMSNorm, SwiGLU, GQA, no biases) as a llama.cpp GGUF file.

Shape legend: V vocabulary, D model dim, H query heads, K key/value heads, Dh head dim, I input features.
The inverse of interop/gguf.py: the same tensor names (gguf.gguf_tensor_names), dims written
innermost first by gguf-py, q_proj / k_proj rows permuted as llama.cpp's convert_hf_to_gguf.py does
(LlamaModel.permute: HF row h·Dh + j·Dh/2 + i to GGUF row h·Dh + 2i + j), the tied output projection
left out (llama.cpp then reuses token_embd). Weight matrices are written as F32 or quantized with
gguf-py's gguf.quants (Q8_0 / Q4_0 / Q4_1, ggml's reference quantizers); norms stay F32.
Metadata: general.architecture "llama", the llama.* hyper-parameters gguf.py reads, general.file_type,
and the tokenizer as tokenizer.ggml.* (model "gpt2" = byte-level BPE, pre = the GGUF name of its
pre-tokenizer regex, tokens in GPT-2's byte-level spelling, added tokens as control / user-defined,
merges, bos / eos ids) with tokenizer.chat_template when known.
Sources: GGUF specification (ggml docs/gguf.md); llama.cpp convert_hf_to_gguf.py (LlamaModel),
gguf-py GGUFWriter and constants (LlamaFileType).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from attnlab.errors import UserError
from attnlab.files import atomic_write
from attnlab.interop.gguf import gguf_tensor_names
from attnlab.models.gpt import GPT
from attnlab.interop.gguf_quants import GGML_TYPE
from attnlab.tokenizers.bpe import ByteLevelBPE
from attnlab.tokenizers.gguf import CONTROL, NORMAL, PRE_PATTERNS, USER_DEFINED
from attnlab.tokenizers.pretokenize import token_to_unicode

GGUF_OUT_TYPES = ("fp32", "q8_0", "q4_0", "q4_1")  # --quantize choices of `attnlab convert --to X.gguf`
FILE_TYPE = {"fp32": 0, "q8_0": 7, "q4_0": 2, "q4_1": 3}  # gguf.LlamaFileType (general.file_type)
# GPTConfig fields a GGUF "llama" model must have (anything else has no llama.cpp equivalent).
LLAMA_FIELDS = {"positions": "rope", "norm": "rmsnorm", "activation": "swiglu", "norm_position": "pre",
                "bias": False, "sliding_window": None, "n_experts": 0}


def check_llama_family(model) -> None:
    """Raise ValueError (one line, naming the fields) unless `model` is a GPT that GGUF "llama" holds."""
    if not isinstance(model, GPT):
        raise UserError(f"GGUF export holds LLaMA-family GPT models; this is a {type(model).__name__}")
    cfg = model.cfg
    wrong = [f"{k}={getattr(cfg, k)!r} (needs {v!r})" for k, v in LLAMA_FIELDS.items() if getattr(cfg, k) != v]
    if cfg.qkv_bias:
        wrong.append("qkv_bias=True (needs False)")
    if wrong:
        raise UserError("GGUF export holds LLaMA-family GPT models (RoPE, RMSNorm, SwiGLU, pre-norm, no biases, "
                        "no sliding window or experts); this model has " + ", ".join(wrong))


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute: (H·Dh, I) rows in HF order -> llama.cpp's order."""
    return (w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])  # (H, 2, Dh/2, I)
            .swapaxes(1, 2).reshape(w.shape))


def _pre_name(tokenizer: ByteLevelBPE) -> str:
    for name in ("smollm", "gpt-2", "llama-bpe", "qwen2"):
        if PRE_PATTERNS[name] == tokenizer.pattern_regex:
            return name
    raise UserError(f"the tokenizer's pre-tokenizer regex ({tokenizer.pattern}) has no GGUF name; GGUF export "
                    f"supports {', '.join(sorted(set(PRE_PATTERNS)))}")


def tokenizer_tables(tokenizer: ByteLevelBPE, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) for tokenizer.ggml.*: `vocab_size` entries (ids the tokenizer
    never produces, e.g. a vocabulary padded for speed, become control tokens <|unused_N|>)."""
    added = {i: (c, special) for c, i, special in tokenizer.added_tokens}
    tokens, types = [], []
    for i in range(vocab_size):
        if i in added:
            tokens.append(added[i][0])
            types.append(CONTROL if added[i][1] else USER_DEFINED)
            continue
        try:
            tokens.append(token_to_unicode(tokenizer.token_bytes(i)))
            types.append(NORMAL)
        except KeyError:
            tokens.append(f"<|unused_{i}|>")
            types.append(CONTROL)
    return tokens, types, [f"{a} {b}" for a, b in tokenizer.merges]


def _tensor(w: torch.Tensor, quantize: str, gguf):
    """(data, raw ggml type) of one tensor: F32, or a matrix quantized with gguf.quants."""
    arr = w.detach().to(torch.float32).contiguous().numpy()
    if arr.ndim != 2 or quantize == "fp32":
        return arr, gguf.GGMLQuantizationType.F32
    kind = gguf.GGMLQuantizationType(GGML_TYPE[quantize])
    return gguf.quants.quantize(arr, kind), kind


def _writer(gguf):
    """gguf.GGUFWriter that also writes an empty array (a character-level vocabulary has no merges,
    and llama.cpp requires the tokenizer.ggml.merges key; the format allows count 0, gguf-py refuses)."""
    class Writer(gguf.GGUFWriter):
        def _pack_val(self, val, vtype, add_vtype, sub_type=None):
            if vtype == gguf.GGUFValueType.ARRAY and len(val) == 0 and sub_type is not None:
                return (self._pack("I", vtype) if add_vtype else b"") + self._pack("I", sub_type) + self._pack("Q", 0)
            return super()._pack_val(val, vtype, add_vtype, sub_type)
    return Writer


@torch.no_grad()
def write_gguf(model: GPT, tokenizer: ByteLevelBPE, path, quantize: str = "fp32", chat_template: str | None = None,
               name: str = "attnlab") -> dict:
    """Write `model` (fp32 weights) and its tokenizer as a GGUF "llama" file, atomically.

    Args:
        model: a LLaMA-family GPT with fp32 (or bf16) weights. tokenizer: its byte-level BPE.
        path: the .gguf file to create or replace. quantize: "fp32", "q8_0", "q4_0" or "q4_1" for
            the weight matrices (D must then be a multiple of 32). chat_template: Jinja source or None.
    Returns:
        {"to", "type", "tensors", "bytes"}.
    Raises:
        ValueError: a model GGUF cannot hold (its fields named), an unknown quantize (named), a
            tokenizer whose pre-tokenizer has no GGUF name, or weights that are not float.
        ImportError: the `gguf` package is missing (pip install 'attnlab[hf]').
    """
    check_llama_family(model)
    if quantize not in GGUF_OUT_TYPES:
        raise UserError(f"quantize={quantize!r} is not supported for GGUF output; supported: "
                        f"{', '.join(GGUF_OUT_TYPES)}", param="quantize")
    try:
        import gguf  # optional dependency (the hf extra)
    except ImportError as err:
        raise ImportError("writing GGUF needs the `gguf` package: pip install 'attnlab[hf]'") from err
    cfg, state = model.cfg, model.state_dict()
    if any(not t.is_floating_point() for t in state.values()):
        raise UserError("GGUF export needs float weights (load the model with dtype fp32)")
    tokens, types, merges = tokenizer_tables(tokenizer, cfg.vocab_size)
    pre = _pre_name(tokenizer)
    names = gguf_tensor_names(cfg.n_layers, cfg.tie_embeddings)

    def write(tmp: Path) -> None:
        w = _writer(gguf)(str(tmp), "llama")
        w.add_name(name), w.add_file_type(FILE_TYPE[quantize])
        if quantize != "fp32":
            w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_block_count(cfg.n_layers), w.add_context_length(cfg.max_seq_len)
        w.add_embedding_length(cfg.d_model), w.add_feed_forward_length(cfg.ffn_dim)
        w.add_head_count(cfg.n_heads), w.add_head_count_kv(cfg.kv_heads)
        w.add_layer_norm_rms_eps(cfg.norm_eps), w.add_rope_freq_base(cfg.rope_theta)
        w.add_rope_dimension_count(cfg.head_dim), w.add_vocab_size(cfg.vocab_size)
        w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre(pre), w.add_token_list(tokens)
        w.add_token_types(types)
        # an empty list (a character-level vocabulary) still needs the key: llama.cpp requires it
        w.add_key_value(gguf.Keys.Tokenizer.MERGES, merges, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)
        if cfg.bos_id is not None:
            w.add_bos_token_id(cfg.bos_id)
        if cfg.eos_id is not None:
            w.add_eos_token_id(cfg.eos_id)
        w.add_add_bos_token(False)
        if chat_template:
            w.add_chat_template(chat_template)
        for g, ours in names.items():
            t = state[ours]
            if ".attn_q." in g or ".attn_k." in g:
                heads = cfg.n_heads if ".attn_q." in g else cfg.kv_heads
                t = torch.from_numpy(permute_qk(t.float().numpy(), heads))
            data, kind = _tensor(t, quantize, gguf)
            w.add_tensor(g, data, raw_dtype=kind)
        w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()

    path = Path(path)
    atomic_write(path, write)
    return {"to": str(path), "type": quantize, "tensors": len(names), "bytes": path.stat().st_size}
