"""Decoder-only Transformer: GPT-2 and the LLaMA / Mistral / Mixtral design as switches on one model.

Shape legend: B batch, T new tokens, S key positions (cached + new), D model dim, V vocabulary,
H query heads, K key/value heads, Dh head dim, L layers.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import ClassVar, Literal, Optional

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from attnlab.config import Config, check, check_literals
from attnlab.errors import UserError
from attnlab.models.base import Model
from attnlab.nn import recompute as selective
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.blocks import TransformerLayer
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.linear import Linear
from attnlab.nn.masks import causal_mask
from attnlab.nn.mlp import make_ffn
from attnlab.nn.moe import MixtureOfExperts
from attnlab.nn.norm import make_norm
from attnlab.nn.positional import sinusoidal_table
from attnlab.nn.rope import RotaryEmbedding


def _swiglu_d_ff(d_model: int) -> int:
    """LLaMA's FFN size: 8/3 · D (the parameters of a 4·D two-matrix FFN), rounded up to a multiple of 32."""
    return -(-8 * d_model // 3 // 32) * 32


@dataclass
class GPTConfig(Config):
    """A decoder-only Transformer with every switch of the GPT → LLaMA/Mistral/Mixtral line.

    Defaults are GPT-2 style; `from_name` applies a preset ("gpt2", "llama", "mistral", "mixtral").
    """

    model_type: ClassVar[str] = "gpt"  # the run's kind: config.json's "model_type", the task registry key

    vocab_size: int = 50304           # tokens (set from the tokenizer)
    d_model: int = 768                # model width D
    n_layers: int = 12                # decoder blocks
    n_heads: int = 12                 # query heads H; d_model % n_heads == 0
    n_kv_heads: Optional[int] = None  # key/value heads K (None = H: MHA; 1: MQA; else GQA); H % K == 0; read kv_heads
    d_ff: Optional[int] = None        # FFN (or each expert's) hidden size; None = 4·D, or 8/3·D for SwiGLU; read ffn_dim
    max_seq_len: int = 1024           # context length; learned/sinusoidal tables have this many rows
    positions: Literal["learned", "sinusoidal", "rope"] = "learned"  # absolute (GPT) or rotary (LLaMA)
    rope_theta: float = 10000.0       # RoPE base θ
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"  # LayerNorm (GPT) or RMSNorm (LLaMA)
    norm_position: Literal["pre", "post"] = "pre"       # Pre-LN (GPT-2 on) or Post-LN (the 2017 paper)
    norm_eps: float = 1e-5            # ε of every norm
    activation: Literal["relu", "gelu", "gelu_tanh", "swiglu"] = "gelu"  # FFN non-linearity (gelu_tanh: GPT-2's)
    sliding_window: Optional[int] = None  # attend to the W most recent positions only (Mistral); None = all
    n_experts: int = 0                # mixture of experts per block: 0 = dense FFN, else E experts
    moe_top_k: int = 2                # experts per token (1 <= moe_top_k <= n_experts)
    router_aux_loss_coef: float = 0.01  # weight of the load-balancing loss added to the training loss
    tie_embeddings: bool = True       # output projection shares the token embedding matrix
    init_std: float = 0.02            # std of the normal init of every matrix (GPT-2's; HF initializer_range)
    bias: bool = True                 # biases on linear layers and LayerNorm
    qkv_bias: Optional[bool] = None   # biases on the q/k/v projections alone (Qwen2); None = bias
    dropout: float = 0.0              # on embeddings and sublayer outputs
    attention_dropout: float = 0.0    # on attention weights
    attention_impl: Literal["sdpa", "math"] = "sdpa"  # fused kernel (FlashAttention path) or explicit math
    bos_id: Optional[int] = None      # special token ids, from the tokenizer (None = it has none)
    eos_id: Optional[int] = None      # generation stops at this token by default

    def __post_init__(self):
        check_literals(self)
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len"):
            value = getattr(self, name)
            check(isinstance(value, int) and value > 0, name, "a positive integer", value)
        for name in ("n_kv_heads", "d_ff"):
            value = getattr(self, name)
            check(value is None or (isinstance(value, int) and value > 0), name, "None or a positive integer", value)
        check(self.d_model % self.n_heads == 0, "d_model", f"divisible by n_heads={self.n_heads}", self.d_model)
        check(self.n_heads % self.kv_heads == 0, "n_kv_heads", f"a divisor of n_heads={self.n_heads}",
               self.n_kv_heads)
        if self.positions == "rope":
            check(self.head_dim % 2 == 0, "d_model / n_heads", "even for RoPE (head dim)", self.head_dim)
            check(self.rope_theta > 0, "rope_theta", "> 0", self.rope_theta)
        if self.positions == "sinusoidal":
            check(self.d_model % 2 == 0, "d_model", "even for sinusoidal positions", self.d_model)
        check(self.sliding_window is None or self.sliding_window >= 1, "sliding_window", ">= 1 or None",
               self.sliding_window)
        check(self.n_experts >= 0, "n_experts", ">= 0 (0 = dense FFN)", self.n_experts)
        if self.n_experts:
            check(1 <= self.moe_top_k <= self.n_experts, "moe_top_k", f"in 1..n_experts={self.n_experts}",
                   self.moe_top_k)
        check(self.router_aux_loss_coef >= 0, "router_aux_loss_coef", ">= 0", self.router_aux_loss_coef)
        check(self.norm_eps > 0, "norm_eps", "> 0", self.norm_eps)
        check(self.init_std > 0, "init_std", "> 0", self.init_std)
        for name in ("dropout", "attention_dropout"):
            check(0.0 <= getattr(self, name) < 1.0, name, "in [0, 1)", getattr(self, name))
        for name in ("bos_id", "eos_id"):
            value = getattr(self, name)
            check(value is None or 0 <= value < self.vocab_size, name, f"None or in [0, vocab_size={self.vocab_size})",
                   value)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """K, the key/value heads: n_kv_heads, or n_heads (multi-head attention) when it is None."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def ffn_dim(self) -> int:
        """The FFN's (or each expert's) hidden size: d_ff, or when None 4·D (8/3·D rounded up to a
        multiple of 32 for SwiGLU, LLaMA's)."""
        if self.d_ff is not None:
            return self.d_ff
        return _swiglu_d_ff(self.d_model) if self.activation == "swiglu" else 4 * self.d_model

    @classmethod
    def from_name(cls, name: str, **overrides) -> "GPTConfig":
        """A preset style with `overrides` on top (sizes, or any field).

        "gpt2": learned positions, LayerNorm, GELU, biases (Radford et al. 2019).
        "llama": RoPE, RMSNorm, SwiGLU, no biases, grouped-query attention with two query heads per
            KV head unless n_kv_heads is given (Touvron et al. 2023; Ainslie et al. 2023).
        "mistral": llama + a sliding window of max_seq_len / 2 unless given (Jiang et al. 2023).
        "mixtral": mistral + 8 experts, 2 per token (Jiang et al. 2024).
        Raises:
            ValueError: for an unknown name (listing the presets) or an invalid field.
        """
        if name not in GPT_PRESETS:
            raise UserError(f"unknown GPT preset {name!r}; known presets: {', '.join(GPT_PRESETS)}")
        fields_ = {**GPT_PRESETS[name], **overrides}
        if name != "gpt2" and "n_kv_heads" not in overrides:
            heads = fields_.get("n_heads", cls.n_heads)
            fields_["n_kv_heads"] = heads // 2 if heads % 2 == 0 else heads
        if name in ("mistral", "mixtral") and "sliding_window" not in overrides:
            fields_["sliding_window"] = max(1, fields_.get("max_seq_len", cls.max_seq_len) // 2)
        return cls(**fields_)


_LLAMA = dict(positions="rope", norm="rmsnorm", activation="swiglu", bias=False, norm_eps=1e-6)
GPT_PRESETS: dict[str, dict] = {
    "gpt2": dict(positions="learned", norm="layernorm", activation="gelu", bias=True),
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "mixtral": {**_LLAMA, "n_experts": 8, "moe_top_k": 2},
}


def _decoder_block(cfg: GPTConfig) -> TransformerLayer:
    """One GPT/LLaMA block: masked self-attention (MHA/GQA, RoPE applied by the model) then an FFN or a
    mixture of experts, with cfg's norm, norm position and biases."""
    d = cfg.d_model
    attn = MultiHeadAttention(d, cfg.n_heads, n_kv_heads=cfg.kv_heads, dropout=cfg.attention_dropout, bias=cfg.bias,
                              impl=cfg.attention_impl, qkv_bias=cfg.qkv_bias)
    if cfg.n_experts:
        ffn = MixtureOfExperts(d, cfg.ffn_dim, cfg.n_experts, cfg.moe_top_k, cfg.activation, bias=cfg.bias)
    else:
        ffn = make_ffn(d, cfg.ffn_dim, cfg.activation, bias=cfg.bias)
    return TransformerLayer(self_attn=attn, ffn=ffn, attn_norm=make_norm(cfg.norm, d, cfg.norm_eps, cfg.bias),
                            ffn_norm=make_norm(cfg.norm, d, cfg.norm_eps, cfg.bias), norm_position=cfg.norm_position,
                            dropout=cfg.dropout)


@dataclass
class GPTOutput:
    logits: torch.Tensor | None                   # (B, T, V); None with return_hidden
    aux_loss: torch.Tensor                        # () mean MoE load-balancing loss over layers (0 if dense)
    attentions: list[torch.Tensor] | None = None  # per layer (B, H, T, S), with need_weights
    hidden: torch.Tensor | None = None            # the final norm's output (logits None), with return_hidden


class GPT(Model):
    """Token embeddings (+ learned or sinusoidal positions, or RoPE inside attention), L decoder-only
    blocks of masked self-attention and FFN/MoE, a final norm (Pre-LN) and the output projection
    (tied to the embeddings when cfg.tie_embeddings).

    Activation checkpointing (`checkpoint_layers = True`): in training, each layer keeps only its
    input and recomputes its activations in the backward pass (torch.utils.checkpoint, non-reentrant;
    Chen et al. 2016): activation memory of one layer instead of L, for one more forward pass.

    Incremental decoding: setup_kv_cache() allocates one KVCache per layer; forward() then appends
    to them and attends to all cached positions; clear_kv_cache() frees them. The caller (generate.py,
    a decode engine of engines/) owns positions and padding: it passes position_ids and the
    key-padding attention_mask. This forward is the reference: the fast decode paths (the fused C++
    step) are engines (engines/), tested equal to it.

    Sources: Radford et al. 2018 / 2019 (GPT, GPT-2: decoder-only, learned positions, Pre-LN, init
    std cfg.init_std (GPT-2's 0.02 by default) with residual projections scaled by 1/√(2L));
    Touvron et al. 2023 (LLaMA: RoPE, RMSNorm, SwiGLU); Ainslie et al. 2023 (GQA); Jiang et al.
    2023 / 2024 (Mistral sliding window, Mixtral MoE).
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.embed_tokens = nn.Embedding(cfg.vocab_size, d)
        if cfg.positions == "learned":
            self.embed_positions = nn.Embedding(cfg.max_seq_len, d)
        elif cfg.positions == "sinusoidal":
            self.register_buffer("position_table", sinusoidal_table(cfg.max_seq_len, d), persistent=False)
        else:
            self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(
_decoder_block(cfg) for _ in range(cfg.n_layers))
        self.norm = make_norm(cfg.norm, d, cfg.norm_eps, cfg.bias) if cfg.norm_position == "pre" else nn.Identity()
        self.lm_head = Linear(d, cfg.vocab_size, bias=False)
        self.caches: list[KVCache] | None = None
        self.checkpoint_layers = False  # training: keep only each layer's input, recompute the rest in backward
        self._init_weights()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @classmethod
    def for_loading(cls, cfg: GPTConfig) -> "GPT":
        """A GPT of `cfg` on the CPU whose parameters are allocated but not initialised (they hold
        whatever memory held), for a loader that fills every one of them and checks that none is
        missing (interop's GGUF and Hugging Face readers). Built on PyTorch's meta device, it skips
        GPT(cfg)'s random initialisation (about 1 s of SmolLM2-135M's load); the buffers computed
        from cfg (RoPE's frequencies, a sinusoidal table) are made as GPT(cfg) makes them, and tied
        embeddings stay tied.
        """
        with torch.device("meta"):
            model = cls(cfg)
        model = model.to_empty(device="cpu")  # a tied parameter becomes two tensors here: tied again below
        if cfg.positions == "sinusoidal":
            model.position_table = sinusoidal_table(cfg.max_seq_len, cfg.d_model)
        elif cfg.positions != "learned":
            model.rotary.inv_freq = model.rotary.frequencies()
        if cfg.tie_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        return model

    def _init_weights(self) -> None:
        residual_std = self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if name.endswith(("out_proj", "down_proj")) else self.cfg.init_std
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    # ------------------------------------------------------------------ KV cache
    def setup_kv_cache(self, batch_size: int, max_len: int, dtype: torch.dtype | None = None) -> None:
        """Allocate one pre-allocated KVCache per layer for `batch_size` sequences of up to `max_len`
        positions. With a sliding window W < max_len the caches roll and hold only 2·W positions.
        """
        p = next(self.parameters())  # the activations' dtype and device (quantized layers hold buffers)
        window = self.cfg.sliding_window
        capacity = min(max_len, 2 * window) if window is not None else max_len
        window = window if window is not None and window < capacity else None
        self.caches = [KVCache(batch_size, self.cfg.kv_heads, capacity, self.cfg.head_dim, dtype or p.dtype,
                               p.device, window) for _ in self.layers]

    def clear_kv_cache(self) -> None:
        self.caches = None

    def set_kv_caches(self, caches: list) -> None:
        """Use these per-layer caches instead of setup_kv_cache's: objects with KVCache's interface
        (length, start, window, max_len, reserve, update), e.g. nn/prefix_kv.SharedPrefixKV, which
        keeps a prompt shared by a batch differentiable in training. clear_kv_cache() drops them."""
        if len(caches) != len(self.layers):
            raise ValueError(f"need one cache per layer ({len(self.layers)}), got {len(caches)}")
        self.caches = list(caches)

    @property
    def max_chunk(self) -> int | None:
        """Most new tokens one forward() may add to a rolling cache (None = no limit beyond max_len)."""
        c = self.caches[0] if self.caches else None
        return None if c is None or c.window is None else c.max_len - c.window + 1

    def kv_cache_bytes(self) -> int:
        """Bytes held by all layers' KV caches (0 when none is set up)."""
        return sum(c.memory_bytes() for c in self.caches or [])

    # ------------------------------------------------------------------ forward
    def _mask(self, t: int, offset: int, key_start: int, attention_mask: torch.Tensor | None,
              device: torch.device) -> torch.Tensor | None:
        window = self.cfg.sliding_window
        if attention_mask is None and t == 1 and (window is None or offset - key_start < window):
            return None  # one new token that may see every held key
        mask = causal_mask(t, device, offset, window, key_start)  # (1, 1, T, S)
        if attention_mask is not None:
            mask = mask & attention_mask[:, None, None, key_start:offset + t].bool()  # (B, 1, T, S)
        return mask

    def _positions(self, x: torch.Tensor, position_ids: torch.Tensor, last: int | None = None):
        """Add absolute positions to x, or return RoPE's (cos, sin). `last`: the largest position when
        the caller knows it (no read of position_ids: no graph break under torch.compile)."""
        if self.cfg.positions == "rope":
            return x, self.rotary(position_ids, x.dtype)
        last = int(position_ids.max()) if last is None else last
        if last >= self.cfg.max_seq_len:
            raise UserError(f"position {last} is past max_seq_len={self.cfg.max_seq_len} "
                            f"({self.cfg.positions} positions have no row for it)")
        if self.cfg.positions == "learned":
            return x + self.embed_positions(position_ids), None
        return x + self.position_table[position_ids].to(x.dtype), None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, need_weights: bool = False,
                logits_to_keep: int | torch.Tensor = 0, return_hidden: bool = False) -> GPTOutput:
        """Args:
            input_ids: (B, T) int64 new tokens.
            attention_mask: (B, S) bool/int over every position so far (cached and new), 1 = real
                token, 0 = padding (left padding of a batch of prompts); None = no padding.
            position_ids: (B, T) int64 positions of the new tokens; None = offset .. offset + T − 1,
                offset being the number of cached positions.
            need_weights: also return each layer's attention weights (the math path).
            logits_to_keep: compute the logits of the last N positions only (generation needs just
                the last one; the output projection is the largest matrix); 0 = all T. Or a (B, T)
                bool tensor: the logits of the positions marked True only (training on some
                positions: a fine-tune's response tokens).
            return_hidden: return the final norm's output of the kept positions as `hidden` and
                no logits (a loss that applies the output projection itself: nn/linear_cross_entropy.py).
        Returns:
            GPTOutput(logits (B, T, V), or (B, N, V) with logits_to_keep N, or (N, V) for the N
            marked positions (row-major order) with a bool logits_to_keep, in the parameters'
            dtype; aux_loss (); attentions or None).
        Raises:
            ValueError: when a position is past max_seq_len for absolute positions, the KV cache
                would overflow, or logits_to_keep is negative.
        """
        selected = isinstance(logits_to_keep, torch.Tensor)
        if selected and (logits_to_keep.dtype != torch.bool or logits_to_keep.shape != input_ids.shape):
            raise UserError(f"a logits_to_keep tensor must be bool of the input's shape {tuple(input_ids.shape)}, "
                            f"got {logits_to_keep.dtype} {tuple(logits_to_keep.shape)}")
        if not selected and logits_to_keep < 0:
            raise UserError(f"logits_to_keep must be >= 0 (0 = every position), got {logits_to_keep}")
        b, t = input_ids.shape
        offset = self.caches[0].length if self.caches else 0
        if self.caches:
            for cache in self.caches:
                cache.reserve(t)
        key_start = self.caches[0].start if self.caches else 0
        last = None
        if position_ids is None:
            position_ids = torch.arange(offset, offset + t, device=input_ids.device)[None].expand(b, t)
            last = offset + t - 1
        # Plain causal attention over the whole input (training, evaluation, a first prefill): SDPA's
        # is_causal path, which never builds a T × T mask.
        is_causal = attention_mask is None and self.cfg.sliding_window is None and offset == 0 and t > 1
        mask = None if is_causal else self._mask(t, offset, key_start, attention_mask, input_ids.device)
        x, rope = self._positions(self.embed_tokens(input_ids), position_ids, last)
        x = self.dropout(x)
        aux, attentions = x.new_zeros(()), [] if need_weights else None
        token_mask = None if attention_mask is None else attention_mask[:, -t:].bool()  # (B, T) real new tokens
        training = self.training and torch.is_grad_enabled()
        recompute = self.checkpoint_layers and training
        # Training without checkpointing: the norms' and SwiGLU's outputs are kept as recipes
        # (nn/recompute.py), remade in the backward from the tensors kept anyway.
        with selective.saving_marked() if training and not recompute else contextlib.nullcontext():
            for i, layer in enumerate(self.layers):
                kwargs = dict(mask=mask, cache=self.caches[i] if self.caches else None, rope=rope,
                              need_weights=need_weights, is_causal=is_causal, token_mask=token_mask)
                out = checkpoint(layer, x, use_reentrant=False, **kwargs) if recompute else layer(x, **kwargs)
                x, aux = out.hidden, aux + out.aux_loss
                if need_weights:
                    attentions.append(out.attn_weights)
            if selected:
                x = x[logits_to_keep]  # (N, D)
            elif logits_to_keep:
                x = x[:, -logits_to_keep:]
            if return_hidden:
                return GPTOutput(None, aux / len(self.layers), attentions, self.norm(x))
            return GPTOutput(self.lm_head(self.norm(x)), aux / len(self.layers), attentions)
