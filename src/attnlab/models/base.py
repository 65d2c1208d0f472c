"""What every attnlab model shares, and what a model that continues text must offer."""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


class Model(nn.Module):
    """Base class of the model families: a module built from one config (`self.cfg`)."""

    is_recurrent = False  # True for a model that decodes with a constant-size state (Mamba), not a KV cache

    def num_parameters(self) -> int:
        """Parameters, tied ones counted once (parameters() yields a shared tensor once)."""
        return sum(p.numel() for p in self.parameters())


class CausalLMOutput(Protocol):
    logits: torch.Tensor        # (B, T, V), or (B, N, V) with logits_to_keep N
    aux_loss: torch.Tensor      # () a loss added in training (MoE load balancing), else 0
    attentions: Any             # per layer (B, H, T, S) with need_weights, else None


@runtime_checkable
class CausalLM(Protocol):
    """What generate.py (sampling, greedy, batched and cached decoding), chat.py and the language-model
    task need of a model that continues text; GPT and Mamba both satisfy it (tests/tasks/test_registry.py).

    cfg has vocab_size, max_seq_len, bos_id and eos_id; a model that is not recurrent also has
    positions and sliding_window (generate.context_window). Decoding state: setup_kv_cache(B, L)
    before a prompt, then forward() continues from what the state holds; clear_kv_cache() after.
    """

    cfg: Any
    is_recurrent: bool  # constant-size decoding state and no context limit (Mamba), else a KV cache

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, need_weights: bool = False,
                logits_to_keep: int = 0) -> CausalLMOutput:
        """input_ids (B, T) int64 new tokens; attention_mask (B, S) 1 = real token over every position
        so far (None: no padding); position_ids (B, T) (None: after the cached ones)."""

    def setup_kv_cache(self, batch_size: int, max_len: int, dtype: torch.dtype | None = None) -> None:
        """Allocate the decoding state of `batch_size` sequences of up to `max_len` positions."""

    def clear_kv_cache(self) -> None:
        """Drop the decoding state."""

    @property
    def max_chunk(self) -> int | None:
        """Most new tokens one forward() may add to the state (None: no limit)."""

    def kv_cache_bytes(self) -> int:
        """Bytes the decoding state holds (0 without one)."""
