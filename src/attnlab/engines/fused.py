"""The fused C++ decode engine: one C++ call per batched step (nn/fused_decode.py, .cpp).

Shape legend: N sequences in one call, V vocabulary.

When it applies (`FusedEngine.unsupported` returns None): a LLaMA-style GPT (models/gpt.py) in
eval mode on the CPU: RoPE, Pre-LN RMSNorm, self-attention (MHA / GQA, optional sliding window,
biases allowed), a dense SwiGLU FFN, every matrix fp32 or block-quantized (Q8_0 / Q4_0 / Q4_1,
each matrix its own kind), and the C++ extension built here (x86-64 with AVX512-VNNI, or with
AVX2, FMA and F16C: nn/quant_kernel.py INSTRUCTION_SETS). Anything else (GPT-2 style, MoE, bf16, Mamba, another device) is the
reference engine's (engines/reference.py); choose.py picks.

    prefill   each prompt through the same C++ step in chunks of up to PREFILL_CHUNK tokens: a chunk
              is N entries of one cache row at consecutive slots and positions, each attending to
              the ones before it (causal), the logits of its last token only. The chunk's rows share
              every weight tile (the products are compute-bound there), on either build of the
              extension and for fp32 and quantized weights alike (on AMD EPYC Zen 3's AVX2 build too,
              once its tiles fit the 16 registers: bench/inference.py's prefill column, README).
    step      N new tokens of N slots of any lengths in one C++ call that reads and writes the same
              per-slot caches (engines/slots.py): each sequence's keys at its own slot, its own
              position, its own visible range (a sliding window).

Caches (`kv_dtype`): fp32, or fp16 as llama.cpp's default f16 cache: half the memory per slot and
half the bytes attention reads per step, which bound a batched step at long contexts (SmolLM2 at
B = 8 reads 368 KB of fp32 keys and values per position; bench/inference.py --kv-dtypes).
"auto" takes fp16 for a model with block-quantized matrices (whose int8 activations already round
more than fp16 keys and values do), fp32 otherwise (fp32 weights keep the
1e-5 agreement with the reference, which holds its caches in the model's dtype). A key or value is
rounded to fp16 once, when written; attention reads it back exactly and computes in fp32.

Exactness (tests/engines/test_fused.py): a sequence's logits do not depend on the other sequences
of the step (bit for bit: each output is summed in one order whatever N and the threads); against
the reference they agree within 1e-5 of the largest logit in fp32, and within QUANT_BOUND quantized:
in decoding, attention's fp32 summation order can move an activation across an int8 rounding
boundary (nn/fused_decode.py); in prefill the chunk's activations are int8 too, where the reference's
products of 32 rows and more are bf16 on CPUs with native bf16 (nn/quant_kernel.py PREFILL_ROWS), two
roundings of similar size.
"""
from __future__ import annotations

from typing import Sequence

import torch

from attnlab.engines.reference import ReferenceEngine
from attnlab.errors import UserError
from attnlab.nn.fused_decode import FusedDecoder, NotSupported
from attnlab.nn.quant_linear import QuantLinear

KV_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}  # the caches' dtypes (module doc)
KV_DTYPE_NAMES = ("auto", *KV_DTYPES)
QUANT_BOUND = 1e-1  # of the largest |logit|: fused against reference, quantized (module doc; SmolLM2: ≤ 0.06)
PREFILL_CHUNK = 128  # prompt tokens per C++ call (its scratch grows with chunk × cache capacity)


def _quantized(model) -> bool:
    """Whether some matrix of `model` is block-quantized."""
    return any(isinstance(m, QuantLinear) for m in model.modules())


def cache_dtype(model, kv_dtype: str = "auto") -> str:
    """The KV cache dtype the fused engine uses for `model`: "fp32" or "fp16" (module doc).

    "auto": fp16 when some matrix of the model is block-quantized, else fp32.
    Raises:
        UserError (a ValueError): kv_dtype not one of KV_DTYPE_NAMES.
    """
    if kv_dtype not in KV_DTYPE_NAMES:
        raise UserError(f"kv_dtype={kv_dtype!r} is not one of {', '.join(KV_DTYPE_NAMES)}", param="kv_dtype")
    if kv_dtype != "auto":
        return kv_dtype
    return "fp16" if _quantized(model) else "fp32"


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
        kv_dtype: the caches' dtype, "auto", "fp32" or "fp16" (module doc; `cache_dtype`).
    Raises:
        NotSupported (a ValueError): the model is not one the step runs, naming why.
        ValueError: as ReferenceEngine; a kv_dtype not allowed here (`cache_dtype`).
    """

    name = "fused-cpp"

    def __init__(self, model, max_batch: int, max_len: int, kv_dtype: str = "auto"):
        self.decoder = _decoder(model)
        self.kv_dtype = cache_dtype(model, kv_dtype)
        super().__init__(model, max_batch, max_len)
        self.window = model.cfg.sliding_window

    def _cache_dtype(self, p: torch.Tensor) -> torch.dtype:
        if p.is_floating_point() and p.dtype != torch.float32:
            raise NotSupported(f"{p.dtype} activations (the fused step runs fp32)")
        return KV_DTYPES[self.kv_dtype]

    @staticmethod
    def unsupported(model) -> str | None:
        """Why the fused engine does not run `model`, or None when it does."""
        try:
            _decoder(model)
        except NotSupported as err:
            return str(err)
        return None

    @torch.no_grad()
    def prefill(self, slots: Sequence[int], prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        slots, prompts = self.table.check_prefill(slots, prompts)
        c, out = self.caches, []
        chunk = PREFILL_CHUNK if c.window is None else min(PREFILL_CHUNK, c.capacity - c.window + 1)
        for s, prompt in zip(slots, prompts):
            c.reset(s)
            for i in range(0, len(prompt), chunk):
                part = prompt[i:i + chunk]
                c.reserve(s, len(part))
                held = c.held(s)
                places = list(range(held, held + len(part)))
                firsts = [0 if self.window is None else max(0, p + 1 - self.window) for p in places]
                logits = self.decoder.step(part, list(range(i, i + len(part))), [s] * len(part), places, firsts,
                                           c.k, c.v, last_only=True)
                c.advance(s, len(part))
            out.append(logits[0])
            self.table.start(s, len(prompt))
        return torch.stack(out)

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
