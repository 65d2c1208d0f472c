"""Mamba: a selective state-space language model, linear in sequence length, with a constant-size
recurrent state in place of a growing KV cache.

Shape legend: B batch, T new tokens, S tokens so far, D model dim, V vocab, Di inner width
(expand · D), N state size, K convolution width.

The model mirrors GPT's interface so that generate.generate drives it unchanged: forward(input_ids,
attention_mask, position_ids, need_weights, logits_to_keep) -> .logits/.aux_loss/.attentions;
setup_kv_cache() / clear_kv_cache() / kv_cache_bytes() / max_chunk. Its "cache" is one MambaState per
layer: (B, Di, K) + (B, Di, N) numbers, the same at position 10 as at position 10⁶.

Source: Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces", §3.4
(the block), §4.2 and appendix E.2 (the language model: pre-norm residual stack of Mamba blocks,
RMSNorm, tied embeddings), and the reference implementation state-spaces/mamba (mixer_seq_simple.py)
for the initialisation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal, Optional, Union

import torch
from torch import nn

from attnlab.config import Config, check, check_literals
from attnlab.errors import UserError
from attnlab.models.base import Model
from attnlab.nn.mamba_block import MambaLayer, MambaState
from attnlab.nn.norm import RMSNorm


@dataclass
class MambaConfig(Config):
    """A Mamba language model. Names follow the paper's code (d_state, d_conv, expand, dt_rank)."""

    model_type: ClassVar[str] = "mamba"  # the run's kind: config.json's "model_type", the task registry key

    vocab_size: int = 50280           # tokens (set from the tokenizer)
    d_model: int = 768                # model width D
    n_layers: int = 24                # Mamba layers (each: RMSNorm + Mamba block + residual)
    d_state: int = 16                 # SSM state size N per channel
    d_conv: int = 4                   # width K of the causal depthwise convolution
    expand: int = 2                   # inner width Di = expand · d_model
    dt_rank: Union[int, Literal["auto"]] = "auto"  # rank R of the Δ projection; "auto" = ceil(d_model / 16); read delta_rank
    dt_min: float = 0.001             # Δ at initialisation is log-uniform in [dt_min, dt_max]
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4       # ... and at least dt_init_floor
    dt_scale: float = 1.0             # dt_proj weight init: ±dt_scale / √R ("random") or that constant
    dt_init: Literal["random", "constant"] = "random"
    conv_bias: bool = True            # bias on the convolution
    bias: bool = False                # biases on in_proj and out_proj
    norm_eps: float = 1e-5            # ε of every RMSNorm
    residual_in_fp32: bool = True     # keep the residual stream in fp32 under bf16/fp16 parameters
    tie_embeddings: bool = True       # output projection shares the token embedding matrix
    init_std: float = 0.02            # std of the normal init of the embeddings
    rescale_prenorm_residual: bool = True  # out_proj init divided by √n_layers (GPT-2's scheme)
    max_seq_len: int = 1024           # training block size for recipes only: the model has no length limit
    bos_id: Optional[int] = None      # special token ids, from the tokenizer (None = it has none)
    eos_id: Optional[int] = None      # generation stops at this token by default

    def __post_init__(self):
        check_literals(self)
        for name in ("vocab_size", "d_model", "n_layers", "d_state", "d_conv", "expand", "max_seq_len"):
            value = getattr(self, name)
            check(isinstance(value, int) and not isinstance(value, bool) and value > 0, name,
                  "a positive integer", value)
        check(self.dt_rank == "auto" or (isinstance(self.dt_rank, int) and not isinstance(self.dt_rank, bool)
                                         and self.dt_rank > 0), "dt_rank", "'auto' or a positive integer",
              self.dt_rank)
        check(self.dt_min > 0, "dt_min", "> 0", self.dt_min)
        check(self.dt_max >= self.dt_min, "dt_max", f">= dt_min={self.dt_min}", self.dt_max)
        check(self.dt_init_floor >= 0, "dt_init_floor", ">= 0", self.dt_init_floor)
        check(self.dt_scale > 0, "dt_scale", "> 0", self.dt_scale)
        check(self.norm_eps > 0, "norm_eps", "> 0", self.norm_eps)
        check(self.init_std > 0, "init_std", "> 0", self.init_std)
        for name in ("bos_id", "eos_id"):
            value = getattr(self, name)
            check(value is None or 0 <= value < self.vocab_size, name, f"None or in [0, vocab_size={self.vocab_size})",
                  value)

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def delta_rank(self) -> int:
        """R, the rank of the Δ projection: dt_rank, or ceil(d_model / 16) for "auto" (the paper's code)."""
        return math.ceil(self.d_model / 16) if self.dt_rank == "auto" else self.dt_rank


@dataclass
class MambaOutput:
    logits: torch.Tensor         # (B, T, V), or (B, N, V) with logits_to_keep N
    aux_loss: torch.Tensor       # () always 0: the field GPT's mixture of experts fills
    attentions: None = None      # a Mamba model has no attention weights


class Mamba(Model):
    """Token embeddings, n_layers pre-norm residual Mamba layers, a final RMSNorm and the output
    projection (tied to the embeddings when cfg.tie_embeddings). No positions: order comes from the
    convolution and the recurrence.

    Decoding: setup_kv_cache() allocates one MambaState per layer; forward() then continues from it
    (a prompt at once, then one token at a time) and clear_kv_cache() drops it.
    """

    is_recurrent: ClassVar[bool] = True  # generate.check_context: no context limit, no positions

    def __init__(self, cfg: MambaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(
            MambaLayer(d_model=cfg.d_model, norm_eps=cfg.norm_eps, residual_in_fp32=cfg.residual_in_fp32,
                       d_state=cfg.d_state, d_conv=cfg.d_conv, expand=cfg.expand, dt_rank=cfg.delta_rank,
                       dt_min=cfg.dt_min, dt_max=cfg.dt_max, dt_init_floor=cfg.dt_init_floor, dt_scale=cfg.dt_scale,
                       dt_init=cfg.dt_init, conv_bias=cfg.conv_bias, bias=cfg.bias)
            for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.states: list[MambaState] | None = None
        self._init_weights()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @torch.no_grad()
    def _init_weights(self) -> None:
        """The reference's: embeddings N(0, init_std), linear biases 0 (but dt_proj's), out_proj
        Kaiming-uniform / √n_layers; in_proj, x_proj and the convolution keep PyTorch's default init,
        A, D and dt_proj their SSM init (MambaBlock.reset_ssm_parameters)."""
        nn.init.normal_(self.embed_tokens.weight, std=self.cfg.init_std)
        if not self.cfg.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, std=self.cfg.init_std)
        for layer in self.layers:
            block = layer.mixer
            for linear in (block.in_proj, block.out_proj):
                if linear.bias is not None:
                    nn.init.zeros_(linear.bias)
            if self.cfg.rescale_prenorm_residual:
                nn.init.kaiming_uniform_(block.out_proj.weight, a=math.sqrt(5))
                block.out_proj.weight /= math.sqrt(self.cfg.n_layers)

    # ------------------------------------------------------------------ recurrent state
    def setup_kv_cache(self, batch_size: int, max_len: int, dtype: torch.dtype | None = None) -> None:
        """Allocate the recurrent state of every layer for `batch_size` sequences, zeroed.

        max_len is accepted for GPT's signature and not used: the state does not grow.
        """
        p = self.embed_tokens.weight
        self.states = [MambaState(batch_size, self.cfg.d_inner, self.cfg.d_conv, self.cfg.d_state, dtype or p.dtype,
                                  p.device) for _ in self.layers]

    def clear_kv_cache(self) -> None:
        self.states = None

    @property
    def max_chunk(self) -> int | None:
        """Most new tokens one forward() may take with a state set up: None, no limit."""
        return None

    def kv_cache_bytes(self) -> int:
        """Bytes held by all layers' states (0 when none is set up); constant in the position."""
        return sum(s.memory_bytes() for s in self.states or [])

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, need_weights: bool = False,
                logits_to_keep: int = 0) -> MambaOutput:
        """Args:
            input_ids: (B, T) int64 new tokens.
            attention_mask: (B, S) bool/int over every position so far (held in the state and new),
                1 = real token, 0 = padding (left padding of a batch of prompts); only its last T
                columns are read. None = no padding.
            position_ids: (B, T) accepted for GPT's signature and ignored (Mamba has no positions).
            need_weights: must be False.
            logits_to_keep: compute the logits of the last N positions only; 0 = all T.
        Returns:
            MambaOutput(logits (B, T, V) or (B, N, V) in the parameters' dtype, aux_loss () zero,
            attentions None).
        Raises:
            ValueError: need_weights=True, a negative logits_to_keep, an attention_mask shorter than
                the input, or a state set up for another batch size.
        """
        if need_weights:
            raise UserError("a Mamba model has no attention weights (need_weights=True is for attention models)")
        if logits_to_keep < 0:
            raise UserError(f"logits_to_keep must be >= 0 (0 = every position), got {logits_to_keep}")
        b, t = input_ids.shape
        mask = None
        if attention_mask is not None:
            if attention_mask.size(-1) < t:
                raise UserError(f"attention_mask covers {attention_mask.size(-1)} positions, fewer than the "
                                f"{t} new tokens")
            mask = attention_mask[:, -t:]                                   # (B, T)
        if self.states is not None and self.states[0].ssm.size(0) != b:
            raise UserError(f"the state was set up for {self.states[0].ssm.size(0)} sequences, got {b}")
        x = self.embed_tokens(input_ids)                                    # (B, T, D)
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, None if self.states is None else self.states[i])
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        h = self.norm(x).to(self.lm_head.weight.dtype)
        return MambaOutput(self.lm_head(h), h.new_zeros(()))
