"""Reading a model's internals for the pictures: attention weights, hidden states and MoE routing,
recorded with forward hooks on the public modules (the models themselves are not changed).

Shape legend: B batch, H heads, T query length, S key length, D model dim, L layers, N tokens,
k experts per token.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.moe import MixtureOfExperts


def attention_modules(model: nn.Module, part: str = "self") -> list[MultiHeadAttention]:
    """The model's attention modules of one kind, in forward order.

    Args:
        part: "self" (every self-attention: BERT's and GPT's layers, and a seq2seq's encoder),
            "decoder" (a seq2seq decoder's masked self-attention) or "cross" (its cross-attention).
    """
    found = []
    for name, module in model.named_modules():
        if not isinstance(module, MultiHeadAttention):
            continue
        is_cross = name.endswith("cross_attn")
        in_decoder = name.startswith("decoder")
        if part == "cross" and is_cross or part == "decoder" and in_decoder and not is_cross \
                or part == "self" and not in_decoder and not is_cross:
            found.append(module)
    return found


@contextmanager
def recorded_attention(modules: list[MultiHeadAttention]):
    """While active, every call of each module computes and records its attention weights.

    Yields a list with one entry per module: the (B, H, T, S) weights of its latest call (the math
    path, as `need_weights=True` asks), or None before the first call.
    """
    records: list[torch.Tensor | None] = [None] * len(modules)
    handles = []
    for i, module in enumerate(modules):
        def ask(mod, args, kwargs):
            return args, {**kwargs, "need_weights": True}

        def keep(mod, args, kwargs, output, i=i):
            records[i] = output[1].detach()

        handles.append(module.register_forward_pre_hook(ask, with_kwargs=True))
        handles.append(module.register_forward_hook(keep, with_kwargs=True))
    try:
        yield records
    finally:
        for h in handles:
            h.remove()


@contextmanager
def recorded_outputs(modules: list[nn.Module]):
    """While active, the latest output tensor of each module (its first element for a tuple)."""
    records: list[torch.Tensor | None] = [None] * len(modules)

    def make(i):
        def keep(mod, args, output):
            records[i] = (output[0] if isinstance(output, tuple) else output).detach()
        return keep

    handles = [m.register_forward_hook(make(i)) for i, m in enumerate(modules)]
    try:
        yield records
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def bert_hidden_states(model: nn.Module, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """A BERT encoder's hidden states: [the embedding layer's output, then each layer's output].

    Args:
        input_ids: (B, S) int64 ([CLS] ... [SEP], no padding).
    Returns:
        L + 1 tensors (B, S, D): index 0 is LayerNorm(token + position + segment embeddings)
        (Hugging Face's hidden_states[0]), index l the output of layer l.
    """
    with recorded_outputs([model.embed_norm, *model.layers]) as states:
        model(input_ids)
    return list(states)


@torch.no_grad()
def token_embeddings(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """(B, S, D) the plain token-embedding rows of `input_ids` (no position, no norm)."""
    return model.embed_tokens(input_ids)


@contextmanager
def recorded_routing(model: nn.Module):
    """While active, each mixture-of-experts layer's chosen experts for every token.

    Yields a list with one entry per MoE layer: (N, k) int64 expert indices of its latest call,
    the top-k of the router's probabilities as MixtureOfExperts.forward chooses them.
    """
    layers = [m for m in model.modules() if isinstance(m, MixtureOfExperts)]
    records: list[torch.Tensor | None] = [None] * len(layers)

    def make(i, top_k):
        def keep(mod, args, logits):
            records[i] = logits.detach().float().softmax(dim=-1).topk(top_k, dim=-1).indices
        return keep

    handles = [m.router.register_forward_hook(make(i, m.top_k)) for i, m in enumerate(layers)]
    try:
        yield records
    finally:
        for h in handles:
            h.remove()
