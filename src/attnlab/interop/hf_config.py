"""Hugging Face `config.json` <-> GPTConfig for the decoder-only architectures attnlab can run exactly.

Supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, MixtralForCausalLM (RoPE, RMSNorm,
SwiGLU, GQA, sliding window, mixture of experts) and GPT2LMHeadModel (learned positions, LayerNorm,
GELU). Anything in a config.json that would change the computation and that GPT cannot reproduce
(RoPE scaling, a head_dim other than hidden_size / num_attention_heads, an unknown activation, per-layer
sliding windows, ...) raises ValueError naming the field: a loaded model either matches transformers'
outputs or is refused. Dropout settings are not carried over on import (loaded models are for
inference; set GPTConfig.dropout for fine-tuning).

Fields absent from a config.json take transformers' class defaults (HF_DEFAULTS), except the sizes,
which must be present.
Source: the configuration_*.py and modeling_*.py files of transformers 5.24.
"""
from __future__ import annotations

import torch

from attnlab.errors import UserError
from attnlab.models.gpt import GPTConfig

LLAMA, MISTRAL, QWEN2, MIXTRAL, GPT2 = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                        "MixtralForCausalLM", "GPT2LMHeadModel")
ARCHITECTURES = (LLAMA, MISTRAL, QWEN2, MIXTRAL, GPT2)
MODEL_TYPES = {LLAMA: "llama", MISTRAL: "mistral", QWEN2: "qwen2", MIXTRAL: "mixtral", GPT2: "gpt2"}

# transformers 5.24's class defaults for the fields read here when config.json leaves them out.
_ROPE_DEFAULTS = dict(hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1,
                      eos_token_id=2, rope_theta=10000.0, attention_dropout=0.0)
HF_DEFAULTS: dict[str, dict] = {
    LLAMA: {**_ROPE_DEFAULTS, "max_position_embeddings": 2048, "attention_bias": False, "mlp_bias": False},
    MISTRAL: {**_ROPE_DEFAULTS, "max_position_embeddings": 131072, "sliding_window": 4096},
    QWEN2: {**_ROPE_DEFAULTS, "max_position_embeddings": 32768, "bos_token_id": None, "eos_token_id": None,
            "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28},
    MIXTRAL: {**_ROPE_DEFAULTS, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
              "sliding_window": None, "num_local_experts": 8, "num_experts_per_tok": 2,
              "router_aux_loss_coef": 0.001},
    GPT2: dict(n_positions=1024, n_inner=None, activation_function="gelu_new", layer_norm_epsilon=1e-5,
               tie_word_embeddings=True, bos_token_id=50256, eos_token_id=50256, scale_attn_weights=True,
               scale_attn_by_inverse_layer_idx=False, add_cross_attention=False),
}
# GPT-2's activation_function -> our FFN activation ("gelu_new" is GELU's tanh approximation).
GPT2_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


def architecture_of(hf: dict) -> str:
    """The one supported architecture a config.json names (`architectures`, else `model_type`).

    Raises:
        ValueError: naming the architecture when it is missing, ambiguous or not supported.
    """
    archs = hf.get("architectures")
    if not archs:
        by_type = {t: a for a, t in MODEL_TYPES.items()}
        if hf.get("model_type") not in by_type:
            raise UserError(f"config.json names no supported architecture (architectures={archs!r}, "
                            f"model_type={hf.get('model_type')!r}); supported: {', '.join(ARCHITECTURES)}")
        return by_type[hf["model_type"]]
    if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in ARCHITECTURES:
        raise UserError(f"unsupported architecture {archs!r} in config.json; supported: {', '.join(ARCHITECTURES)}")
    return archs[0]


def _need(hf: dict, *names: str):
    missing = [n for n in names if not isinstance(hf.get(n), int)]
    if missing:
        raise UserError(f"config.json lacks the integer size field(s) {missing}")
    return [hf[n] for n in names]


def _rope_theta(hf: dict, default: float) -> float:
    """RoPE θ from `rope_parameters` (transformers 5) or `rope_theta` (4.x); refuses any scaling."""
    scaling = hf.get("rope_scaling")
    if scaling is not None and (not isinstance(scaling, dict)
                                or scaling.get("rope_type", scaling.get("type")) != "default"):
        raise UserError(f"rope_scaling={scaling!r} is not supported (attnlab's RoPE has no scaling)")
    params = hf.get("rope_parameters") or scaling or {}
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        raise UserError(f"rope_parameters={params!r} is not supported (one plain RoPE for all layers only)")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise UserError(f"rope_parameters.rope_type={kind!r} is not supported (only 'default' RoPE)")
    for where in (params, hf):
        factor = where.get("partial_rotary_factor")
        if factor not in (None, 1, 1.0):
            raise UserError(f"partial_rotary_factor={factor!r} is not supported (RoPE on the whole head only)")
    return float(params.get("rope_theta", hf.get("rope_theta", default)))


def _token_id(value):
    """An id, or the first of a list (transformers allows several eos ids; GPTConfig keeps one)."""
    if isinstance(value, list):
        return value[0] if value else None
    return value


def _qwen2_window(hf: dict, n_layers: int):
    """Qwen2's sliding window: on layers >= max_window_layers, and only with use_sliding_window."""
    if not hf["use_sliding_window"] or hf["sliding_window"] is None:
        return None
    types = hf.get("layer_types") or ["sliding_attention" if i >= hf["max_window_layers"] else "full_attention"
                                      for i in range(n_layers)]
    if set(types) == {"full_attention"}:
        return None
    if set(types) != {"sliding_attention"}:
        raise UserError(f"use_sliding_window with max_window_layers={hf['max_window_layers']} (layer_types "
                        f"{types}) is not supported: GPT applies one sliding window to every layer or none")
    return hf["sliding_window"]


def _rope_fields(arch: str, hf: dict) -> dict:
    d, n_layers, heads, d_ff = _need(hf, "hidden_size", "num_hidden_layers", "num_attention_heads",
                                     "intermediate_size")
    if hf.get("head_dim") not in (None, d // heads):
        raise UserError(f"head_dim={hf['head_dim']} differs from hidden_size / num_attention_heads = "
                        f"{d // heads}; GPT has no separate head_dim")
    if hf["hidden_act"] not in ("silu", "swish"):
        raise UserError(f"hidden_act={hf['hidden_act']!r} is not supported for {arch} (the gated MLP must be "
                        f"SwiGLU: 'silu')")
    bias, qkv_bias = False, None
    if arch == LLAMA:
        if bool(hf["attention_bias"]) != bool(hf["mlp_bias"]):
            raise UserError(f"attention_bias={hf['attention_bias']} with mlp_bias={hf['mlp_bias']} is not "
                            f"supported (GPT has biases on all linear layers or on none)")
        bias = bool(hf["attention_bias"])
    if arch == QWEN2:
        qkv_bias = True
    window = _qwen2_window(hf, n_layers) if arch == QWEN2 else hf.get("sliding_window")
    if arch == LLAMA:
        window = None
    fields = dict(vocab_size=_need(hf, "vocab_size")[0], d_model=d, n_layers=n_layers, n_heads=heads,
                  n_kv_heads=hf.get("num_key_value_heads") or heads, d_ff=d_ff,
                  max_seq_len=hf["max_position_embeddings"], positions="rope",
                  rope_theta=_rope_theta(hf, HF_DEFAULTS[arch]["rope_theta"]), norm="rmsnorm",
                  norm_eps=hf["rms_norm_eps"], activation="swiglu", sliding_window=window,
                  bias=bias, qkv_bias=qkv_bias)
    if arch == MIXTRAL:
        fields.update(n_experts=hf["num_local_experts"], moe_top_k=hf["num_experts_per_tok"],
                      router_aux_loss_coef=hf["router_aux_loss_coef"])
    return fields


def _gpt2_fields(hf: dict) -> dict:
    d, n_layers, heads, vocab = _need(hf, "n_embd", "n_layer", "n_head", "vocab_size")
    for name, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                     ("add_cross_attention", False)):
        if bool(hf[name]) != ok:
            raise UserError(f"{name}={hf[name]} is not supported for GPT2LMHeadModel (only {ok})")
    act = GPT2_ACTIVATIONS.get(hf["activation_function"])
    if act is None:
        raise UserError(f"activation_function={hf['activation_function']!r} is not supported; supported: "
                        f"{', '.join(GPT2_ACTIVATIONS)}")
    return dict(vocab_size=vocab, d_model=d, n_layers=n_layers, n_heads=heads, d_ff=hf["n_inner"] or 4 * d,
                max_seq_len=hf["n_positions"], positions="learned", norm="layernorm",
                norm_eps=hf["layer_norm_epsilon"], activation=act, bias=True)


def gpt_config_from_hf(hf: dict) -> tuple[str, GPTConfig]:
    """Map a Hugging Face config.json (as a dict) to (architecture, GPTConfig).

    Raises:
        ValueError: naming the architecture or field that is unsupported or would change the math,
            or the GPTConfig field that the mapped value makes invalid.
    """
    arch = architecture_of(hf)
    if "num_experts" in hf and "num_local_experts" not in hf:  # MixtralConfig's attribute_map alias
        hf = {**hf, "num_local_experts": hf["num_experts"]}
    hf = {**HF_DEFAULTS[arch], **{k: v for k, v in hf.items() if v is not None or k.endswith("token_id")
                                  or k == "sliding_window"}}
    fields = _gpt2_fields(hf) if arch == GPT2 else _rope_fields(arch, hf)
    fields.update(tie_embeddings=bool(hf["tie_word_embeddings"]), bos_id=_token_id(hf["bos_token_id"]),
                  eos_id=_token_id(hf["eos_token_id"]), init_std=float(hf.get("initializer_range", 0.02)))
    try:
        return arch, GPTConfig(**fields)
    except ValueError as err:
        raise UserError(f"config.json ({arch}) maps to an invalid GPTConfig: {err}") from None


def architecture_for(cfg: GPTConfig) -> str:
    """The Hugging Face architecture that computes exactly what a GPT with `cfg` computes.

    Raises:
        ValueError: naming the option (or combination) that has no Hugging Face equivalent.
    """
    def no(what: str):
        raise UserError(f"{what} has no Hugging Face equivalent among {', '.join(ARCHITECTURES)}")

    if cfg.norm_position != "pre":
        no(f"norm_position={cfg.norm_position!r} (Post-LN)")
    if cfg.positions == "sinusoidal":
        no("positions='sinusoidal'")
    style = (cfg.positions, cfg.norm, cfg.activation == "swiglu")
    qkv_bias = cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias
    if style[0] == "learned":
        if style[1:] != ("layernorm", False):
            no(f"learned positions with norm={cfg.norm!r}, activation={cfg.activation!r} (GPT-2 needs "
               f"layernorm and relu/gelu/gelu_tanh)")
        # GPT-2 has every bias: a model without biases is written with zero ones (exact); only a
        # mix of q/k/v biases and no others has no GPT-2 form.
        for ok, what in ((cfg.bias == qkv_bias, f"bias={cfg.bias}, qkv_bias={cfg.qkv_bias} with learned "
                                                f"positions (GPT-2 has all biases or, written as zeros, none)"),
                         (cfg.kv_heads == cfg.n_heads, f"n_kv_heads={cfg.kv_heads} (GQA) with learned positions"),
                         (cfg.sliding_window is None, f"sliding_window={cfg.sliding_window} with learned positions"),
                         (cfg.n_experts == 0, f"n_experts={cfg.n_experts} with learned positions")):
            if not ok:
                no(what)
        return GPT2
    if style[1:] != ("rmsnorm", True):
        no(f"RoPE with norm={cfg.norm!r}, activation={cfg.activation!r} (LLaMA-style needs rmsnorm and swiglu)")
    if cfg.n_experts:
        if cfg.bias or qkv_bias:
            no(f"n_experts={cfg.n_experts} with bias={cfg.bias}, qkv_bias={cfg.qkv_bias} (Mixtral has no biases)")
        return MIXTRAL
    if qkv_bias and not cfg.bias:
        return QWEN2
    if cfg.bias and not qkv_bias:
        no("bias=True with qkv_bias=False")
    if cfg.sliding_window is not None:
        if cfg.bias:
            no(f"sliding_window={cfg.sliding_window} with bias=True (Mistral has no biases)")
        return MISTRAL
    return LLAMA


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def hf_config_for(cfg: GPTConfig, dtype: torch.dtype = torch.float32) -> dict:
    """The config.json (as a dict) of the Hugging Face model equal to a GPT with `cfg`.

    Raises:
        ValueError: from architecture_for, for options with no Hugging Face equivalent.
    """
    arch = architecture_for(cfg)
    common = dict(architectures=[arch], model_type=MODEL_TYPES[arch], vocab_size=cfg.vocab_size,
                  tie_word_embeddings=cfg.tie_embeddings, bos_token_id=cfg.bos_id, eos_token_id=cfg.eos_id,
                  initializer_range=cfg.init_std, dtype=_dtype_name(dtype))
    if arch == GPT2:
        act = {v: k for k, v in GPT2_ACTIVATIONS.items() if k != "gelu_pytorch_tanh"}[cfg.activation]
        return {**common, "n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
                "n_inner": cfg.ffn_dim, "n_positions": cfg.max_seq_len, "activation_function": act,
                "layer_norm_epsilon": cfg.norm_eps, "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout,
                "attn_pdrop": cfg.attention_dropout, "scale_attn_weights": True}
    out = {**common, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
           "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.kv_heads,
           "intermediate_size": cfg.ffn_dim, "hidden_act": "silu", "max_position_embeddings": cfg.max_seq_len,
           "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
           "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
           "attention_dropout": cfg.attention_dropout}
    if arch != QWEN2:
        out["head_dim"] = cfg.head_dim
    if arch == LLAMA:
        out.update(attention_bias=cfg.bias, mlp_bias=cfg.bias)
    elif arch in (MISTRAL, MIXTRAL):
        out["sliding_window"] = cfg.sliding_window
    if arch == QWEN2:
        window = cfg.sliding_window is not None
        out.update(use_sliding_window=window, sliding_window=cfg.sliding_window,
                   max_window_layers=0 if window else cfg.n_layers,
                   layer_types=[("sliding" if window else "full") + "_attention"] * cfg.n_layers)
    if arch == MIXTRAL:
        out.update(num_local_experts=cfg.n_experts, num_experts_per_tok=cfg.moe_top_k,
                   router_aux_loss_coef=cfg.router_aux_loss_coef, router_jitter_noise=0.0)
    return out
