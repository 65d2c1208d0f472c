"""kv-cache: per-token decoding time with and without the KV cache, and the cache's size for
multi-head, grouped-query and multi-query attention of the same model.

Without a cache every new token recomputes the whole sequence (time grows with the position); with
it each step runs one token against the stored keys and values. The sizes are those of nn/kv_cache's
KVCache allocated (on the meta device: no memory is used) with K = H, the model's own K, and K = 1.
Shape legend: L layers, H query heads, K key/value heads, Dh head dim, T positions.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from attnlab.errors import UserError
from attnlab.nn.kv_cache import KVCache
from attnlab.viz.figure import finish, new_figure
from attnlab.viz.sources import FITTING, Source
from attnlab.tasks.kinds import Kind

POSITIONS = (8, 32, 64, 128, 256, 512)


@dataclass
class KVCacheResult:
    model: str
    positions: list[int]                 # tokens already read when the step runs
    seconds: dict[str, list[float]]      # "cache" / "no cache" -> seconds of that decoding step
    layers: int
    heads: int
    kv_heads: int                        # the model's own K
    head_dim: int
    contexts: list[int]                  # T for the sizes
    cache_bytes: dict[str, list[int]]    # "MHA (K=H)", "GQA (K=..)", "MQA (K=1)" -> bytes per context (batch 1)

    @property
    def caption(self) -> str:
        c, n = (1000 * self.seconds[k][-1] for k in ("cache", "no cache"))
        mha, own = (self.cache_bytes[k][-1] for k in list(self.cache_bytes)[:2])
        return (f"Without the cache each token recomputes the whole sequence, so its time grows with the position "
                f"({n:.0f} ms at position {self.positions[-1]}, against {c:.0f} ms with the cache). "
                f"The cache stores K and V per layer and position: with {self.kv_heads} KV heads instead of "
                f"{self.heads} it is {mha / own:.0f}× smaller, and one KV head (MQA) is {self.heads}× smaller.")


@torch.no_grad()
def step_seconds(model, ids: list[int], position: int, use_cache: bool, repeats: int = 2) -> float:
    """Fastest of `repeats` timings of the forward pass that produces the token after `position` tokens.

    Without the cache that is a forward over all `position` tokens; with it, one token against a cache
    prefilled with the position − 1 before it (the prefill is not timed).
    """
    x = torch.tensor([ids[:position + repeats]])
    times = []
    if not use_cache:
        for _ in range(repeats):
            start = time.perf_counter()
            model(x[:, :position], logits_to_keep=1)
            times.append(time.perf_counter() - start)
        return min(times)
    model.setup_kv_cache(1, position + repeats)
    try:
        model(x[:, :position - 1], logits_to_keep=1)
        for r in range(repeats):
            start = time.perf_counter()
            model(x[:, position - 1 + r:position + r], logits_to_keep=1)
            times.append(time.perf_counter() - start)
    finally:
        model.clear_kv_cache()
    return min(times)


def cache_sizes(layers: int, heads: int, kv_heads: int, head_dim: int, contexts: list[int]) -> dict[str, list[int]]:
    """Bytes of an fp32 KV cache (batch 1) at each context length, for K = H, the model's K and K = 1."""
    variants = {f"MHA (K={heads})": heads, f"GQA (K={kv_heads}, this model)": kv_heads, "MQA (K=1)": 1}
    if kv_heads == heads:
        variants = {f"MHA (K={heads}, this model)": heads, f"GQA (K={max(1, heads // 4)})": max(1, heads // 4),
                    "MQA (K=1)": 1}
    return {name: [layers * KVCache(1, k, t, head_dim, device="meta").memory_bytes() for t in contexts]
            for name, k in variants.items()}


def kv_cache_timing(source: Source, text: str, positions: tuple[int, ...] = POSITIONS) -> KVCacheResult:
    """Time one decoding step at each position of `text`, with and without the cache.

    Raises:
        ValueError: a model that is not a decoder-only language model, or a text too short for the
            positions (or positions beyond the model's context).
    """
    if source.kind is not Kind.CAUSAL_LM:
        raise UserError(f"the kv-cache figure needs a decoder: {FITTING[Kind.CAUSAL_LM]}; {source.name} is "
                        f"{source.described}")
    model, cfg = source.model, source.model.cfg
    positions = sorted(set(positions))
    if not positions or positions[0] < 2 or positions[-1] + 2 > cfg.max_seq_len:
        raise UserError(f"--positions must lie in 2..{cfg.max_seq_len - 2} (the model's context), got {positions}")
    ids = source.tokenizer.encode(text)
    if len(ids) < positions[-1] + 2:
        raise UserError(f"the text has {len(ids)} tokens; timing position {positions[-1]} needs "
                        f"{positions[-1] + 2}")
    seconds = {"cache": [step_seconds(model, ids, p, True) for p in positions],
               "no cache": [step_seconds(model, ids, p, False) for p in positions]}
    contexts = sorted({min(cfg.max_seq_len, t) for t in (256, 1024, 2048, 4096, 8192)})
    return KVCacheResult(source.name, positions, seconds, cfg.n_layers, cfg.n_heads, cfg.kv_heads, cfg.head_dim,
                         contexts, cache_sizes(cfg.n_layers, cfg.n_heads, cfg.kv_heads, cfg.head_dim, contexts))


def draw_kv_cache(r: KVCacheResult, out) -> None:
    fig = new_figure(12, 4.4)
    ax, bx = fig.subplots(1, 2)
    for which, color in (("no cache", "#e76f51"), ("cache", "#264653")):
        ax.plot(r.positions, 1000 * np.array(r.seconds[which]), "o-", color=color, label=which)
    ax.set_xlabel("tokens already in the sequence")
    ax.set_ylabel("milliseconds for the next token")
    ax.set_ylim(bottom=0)
    ax.set_title(f"one decoding step of {r.model} (batch 1, fastest of 2)", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    x = np.arange(len(r.contexts))
    width = 0.8 / len(r.cache_bytes)
    for k, (name, sizes) in enumerate(r.cache_bytes.items()):
        bars = bx.bar(x + (k - (len(r.cache_bytes) - 1) / 2) * width, np.array(sizes) / 2 ** 20, width, label=name)
        bx.bar_label(bars, [f"{s / 2 ** 20:,.0f}" for s in sizes], fontsize=6, rotation=90, padding=2)
    bx.set_xticks(x, [str(t) for t in r.contexts])
    bx.set_xlabel("context length (tokens)")
    bx.set_ylabel("KV-cache size (MiB, fp32, batch 1)")
    bx.set_title(f"{r.layers} layers × 2 (K, V) × K heads × {r.head_dim} dims × T", fontsize=9)
    bx.legend(fontsize=7)
    bx.margins(y=0.15)
    finish(fig, "KV cache: decoding time and memory", r.caption, out)
