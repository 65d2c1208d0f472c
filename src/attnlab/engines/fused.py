"""The fused C++ decode engine: one C++ call per batched step (nn/fused_decode.py, .cpp).

Shape legend: N sequences in one call, V vocabulary.

When it applies (`FusedEngine.unsupported` returns None): a LLaMA-style GPT (models/gpt.py) in
eval mode on the CPU: RoPE, Pre-LN RMSNorm, self-attention (MHA / GQA, optional sliding window,
biases allowed), a dense SwiGLU FFN, every matrix fp32 or block-quantized (Q8_0 / Q4_0 / Q4_1,
each matrix its own kind), and the C++ extension built here (x86-64 with AVX512-VNNI,
nn/quant_kernel.py). Anything else (GPT-2 style, MoE, bf16, Mamba, another device) is the
reference engine's (engines/reference.py); choose.py picks.

    prefill   the model's own forward into the slot's caches, as the reference engine (prompts
              are compute-bound products: BLAS / oneDNN GEMMs).
    step      N new tokens of N slots of any lengths in one C++ call that reads and writes the same
              per-slot caches (engines/slots.py): each sequence's keys at its own slot, its own
              position, its own visible range (a sliding window).

Exactness (tests/engines/test_fused.py): a sequence's logits do not depend on the other sequences
of the step (bit for bit: each output is summed in one order whatever N and the threads); against
the reference they agree within 1e-5 of the largest logit in fp32, and within QUANT_BOUND quantized
(int8 activations: attention's fp32 summation order can move an activation across an int8 rounding
boundary; nn/fused_decode.py).
"""
from __future__ import annotations

from typing import Sequence

import torch

from attnlab.engines.reference import ReferenceEngine
from attnlab.nn.fused_decode import FusedDecoder, NotSupported

QUANT_BOUND = 5e-2  # of the largest |logit|: fused against reference with int8 activations (module doc)


def _decoder(model) -> FusedDecoder:
    """The C++ plan bound to `model`'s weights, or NotSupported naming why not."""
    cfg = getattr(model, "cfg", None)
    if getattr(model, "is_recurrent", False) or not hasattr(cfg, "positions"):
        raise NotSupported(f"a {type(model).__name__} (the fused step runs LLaMA-style GPT models)")
    if model.training:
        raise NotSupported("the model is in training mode (call model.eval())")
    p = next(model.parameters())
    if p.device.type != "cpu":
        raise NotSupported(f"weights on {p.device} (the fused step runs on the CPU)")
    return FusedDecoder.build(embed=model.embed_tokens, layers=model.layers, norm=model.norm, lm_head=model.lm_head,
                              rotary=getattr(model, "rotary", None))


class FusedEngine(ReferenceEngine):
    """DecodeEngine (engines/base.py) over the fused C++ step.

    Args:
        model: a GPT that the step runs (module doc). max_batch: slots. max_len: positions per slot.
    Raises:
        NotSupported (a ValueError): the model is not one the step runs, naming why.
        ValueError: as ReferenceEngine.
    """

    name = "fused-cpp"

    def __init__(self, model, max_batch: int, max_len: int):
        self.decoder = _decoder(model)
        super().__init__(model, max_batch, max_len)
        if self.caches.k[0].dtype != torch.float32:
            raise NotSupported(f"{self.caches.k[0].dtype} activations (the fused step runs fp32)")
        self.window = model.cfg.sliding_window

    @staticmethod
    def unsupported(model) -> str | None:
        """Why the fused engine does not run `model`, or None when it does."""
        try:
            _decoder(model)
        except NotSupported as err:
            return str(err)
        return None

    @torch.no_grad()
    def step(self, slots: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        slots, tokens = self.table.check_step(slots, tokens)
        c = self.caches
        for s in slots:
            c.reserve(s, 1)
        held = [c.held(s) for s in slots]  # where each new key goes
        firsts = [0 if self.window is None else max(0, h + 1 - self.window) for h in held]
        positions = [self.table.lengths[s] for s in slots]
        logits = self.decoder.step(tokens, positions, slots, held, firsts, c.k, c.v)
        for s in slots:
            c.advance(s, 1)
            self.table.lengths[s] += 1
        return logits
