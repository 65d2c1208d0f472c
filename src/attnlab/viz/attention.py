"""attention: what one token attends to in every layer and head, and one head's full map.

Shape legend: L layers, H heads, T query tokens, S key tokens.
Self-attention of an encoder (every token sees every token), of a decoder (only the past is
visible) or of a translation model's encoder; with `cross`, a translation model's decoder→encoder
attention over a sentence and its translation (each row labelled by the target token that decoder
position predicts).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from attnlab.errors import UserError
from attnlab.generate import greedy_decode
from attnlab.viz.capture import attention_modules, recorded_attention
from attnlab.viz.figure import finish, new_figure, short
from attnlab.viz.sources import FITTING, Source
from attnlab.tasks.kinds import Kind

EXAMPLE = "The animal didn't cross the street because it was too tired."  # the example sentence
CROSS_EXAMPLE = "A man is riding a bicycle down the street."  # a sentence to translate (--cross)
CROSS = "cross"  # AttentionMaps.kind of a translation model's decoder→encoder attention
SPECIAL = {"[CLS]", "[SEP]", "[PAD]", "<bos>", "<eos>", "<pad>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"}


@dataclass
class AttentionMaps:
    """Attention weights of one text through one model."""

    model: str                  # the model's name or directory
    kind: str                   # the model's Kind (a seq2seq model: its encoder), or CROSS
    text: str                   # the input (the source sentence for a seq2seq model and CROSS)
    query_tokens: list[str]     # T display strings (rows)
    key_tokens: list[str]       # S display strings (columns)
    weights: np.ndarray         # (L, H, T, S) float32, each row a probability distribution
    target: str | None = None   # "cross": the translation whose decoder rows these are
    special: list[bool] = field(default_factory=list)  # per key: a special token ([CLS], <eos>, ...)

    @property
    def causal(self) -> bool:
        return self.kind is Kind.CAUSAL_LM


def _self_weights(source: Source, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids])
    if source.kind is Kind.CAUSAL_LM:
        return torch.stack(source.model(x, need_weights=True).attentions)[:, 0]  # (L, H, T, T)
    modules = attention_modules(source.model, "self")
    with recorded_attention(modules) as records:
        source.model(x) if source.kind is Kind.ENCODER else source.model.encode(x)
    return torch.stack(records)[:, 0]  # (L, H, S, S)


def _cross_weights(source: Source, src: list[int], tgt: list[int]) -> torch.Tensor:
    model = source.model
    with recorded_attention(attention_modules(model, "cross")) as records:
        model(torch.tensor([src]), torch.tensor([[model.cfg.bos_id] + tgt]))
    return torch.stack(records)[:, 0]  # (L, H, T + 1, S)


@torch.no_grad()
def attention_maps(source: Source, text: str, cross: bool = False, target: str | None = None) -> AttentionMaps:
    """The attention weights of `text` through `source`'s model.

    Args:
        cross: a translation model's decoder→encoder attention over `text` and its translation
            (`target`, or the model's greedy translation when None).
    Returns:
        AttentionMaps; with `cross`, T = target tokens + <eos> and S = source tokens.
    Raises:
        ValueError: an empty text, or `cross` on a model that is not encoder–decoder.
    """
    if not text.strip():
        raise UserError("--text is empty; give a sentence")
    if cross and source.kind is not Kind.SEQ2SEQ:
        raise UserError(f"--cross needs an encoder–decoder model: {FITTING[Kind.SEQ2SEQ]}; "
                        f"{source.name} is {source.described}")
    ids, tokens = source.tokenize(text)
    if source.kind is not Kind.ENCODER and len(ids) > source.model.cfg.max_seq_len:
        raise UserError(f"the text has {len(ids)} tokens; the model reads at most {source.model.cfg.max_seq_len}")
    if not cross:
        weights = _self_weights(source, ids)
        return AttentionMaps(source.name, source.kind, text, tokens, tokens, weights.float().numpy(),
                             special=[t in SPECIAL for t in tokens])
    if target is None:
        tgt = greedy_decode(source.model, torch.tensor([ids]))[0]
    else:
        tgt = source.tokenizer.encode(target)
    weights = _cross_weights(source, ids, tgt)
    rows = [source.display(i) for i in tgt] + ["<eos>"]
    return AttentionMaps(source.name, CROSS, text, rows, tokens, weights.float().numpy(),
                         source.tokenizer.decode(tgt), [False] * len(tokens))


def _norm(token: str) -> str:
    return token.strip().removeprefix("##").strip().lower()


def find_token(tokens: list[str], token: str, flag: str = "--token") -> int:
    """Position of the first token whose text is `token` (case, spaces and ## ignored).

    Raises:
        ValueError: naming `flag` and listing the tokens when none matches.
    """
    want = _norm(token)
    for i, t in enumerate(tokens):
        if _norm(t) == want:
            return i
    raise UserError(f"{flag} {token!r} is not a token of the text; its tokens are: "
                    + " ".join(repr(t.strip() or t) for t in tokens))


def default_query(maps: AttentionMaps) -> int:
    """The first query that is not a special token (0 if all are)."""
    specials = [t in SPECIAL for t in maps.query_tokens]
    return next((i for i, s in enumerate(specials) if not s), 0)


def _others(maps: AttentionMaps, index: int) -> list[int]:
    """Keys other than the query itself that are not special tokens."""
    same = maps.kind != CROSS
    return [j for j in range(len(maps.key_tokens))
            if not (same and j == index) and not (maps.special and maps.special[j])]


def top_heads(maps: AttentionMaps, index: int) -> list[dict]:
    """For each other key token, the layer and head whose weight on it from query `index` is the
    largest (layers and heads count from 0), with that weight."""
    out = []
    w = maps.weights[:, :, index, :]  # (L, H, S)
    for j in _others(maps, index):
        layer, head = np.unravel_index(int(np.argmax(w[:, :, j])), w.shape[:2])
        out.append({"position": j, "token": maps.key_tokens[j], "layer": int(layer), "head": int(head),
                    "weight": round(float(w[layer, head, j]), 4)})
    return out


def head_for(maps: AttentionMaps, index: int, key: int) -> tuple[int, int]:
    """The (layer, head) whose weight from query `index` on key `key` is the largest."""
    w = maps.weights[:, :, index, key]  # (L, H)
    layer, head = np.unravel_index(int(np.argmax(w)), w.shape)
    return int(layer), int(head)


def strongest_head(maps: AttentionMaps, index: int) -> tuple[int, int]:
    """The (layer, head) that puts the most weight on any other non-special key from query
    `index`; the last layer's head 0 when there is no such key."""
    heads = top_heads(maps, index)
    if not heads:
        return maps.weights.shape[0] - 1, 0
    best = max(heads, key=lambda h: h["weight"])
    return best["layer"], best["head"]


def sharpest_layer(maps: AttentionMaps) -> int:
    """The layer whose mean-of-heads map is the most peaked: the largest average over queries of
    the row's maximum weight (for cross-attention, the clearest word alignment)."""
    return int(np.argmax(maps.weights.mean(axis=1).max(axis=-1).mean(axis=-1)))


def head_map(maps: AttentionMaps, layer: int, head: int | None) -> np.ndarray:
    """(T, S) the weights of one head, or their mean over the layer's heads when head is None."""
    return maps.weights[layer].mean(axis=0) if head is None else maps.weights[layer, head]


def alignment(maps: AttentionMaps, layer: int, head: int | None = None) -> list[tuple[str, str]]:
    """(query token, the key it puts the most weight on) for every query of one head or head mean."""
    w = head_map(maps, layer, head)
    return [(q.strip(), maps.key_tokens[int(j)].strip()) for q, j in zip(maps.query_tokens, w.argmax(axis=-1))]


def head_name(head: int | None) -> str:
    return "mean of heads" if head is None else f"head {head}"


def sink_share(maps: AttentionMaps, index: int) -> tuple[str, float]:
    """What query `index` puts the most weight on when averaged over every layer and head, and that
    mean weight: special tokens together (encoders), or else the single key with the largest mean."""
    mean = maps.weights[:, :, index, :].mean(axis=(0, 1))  # (S,)
    if any(maps.special):
        return "the special tokens", float(mean[np.array(maps.special)].sum())
    j = int(np.argmax(mean))
    return repr(maps.key_tokens[j].strip()), float(mean[j])


def finding(maps: AttentionMaps, index: int, layer: int, head: int | None) -> str:
    """What the drawn weights show, measured: the alignment of a cross-attention map, or where the
    query's weight goes on average over every head."""
    if maps.kind == CROSS:
        pairs = ", ".join(f"{q}→{k}" for q, k in alignment(maps, layer, head))
        return f"Layer {layer}, {head_name(head)}: each target token's strongest link is {pairs}."
    query = repr(maps.query_tokens[index].strip())
    sink, share = sink_share(maps, index)
    return f"Each row sums to 1. Averaged over all heads, {query} puts {share:.0%} of its weight on {sink}."


def caption(maps: AttentionMaps, index: int, layer: int, head: int | None) -> str:
    """The figure's caption: what the panels are, then the finding."""
    who = {Kind.ENCODER: "every token sees every other", Kind.CAUSAL_LM: "only the past is visible, so the upper "
           "triangle is empty", Kind.SEQ2SEQ: "the translation model's encoder", CROSS: "each target token "
           "(row) attends over the source"}[maps.kind]
    query = repr(maps.query_tokens[index].strip())
    return (f"Left: the weights of {query} on each {'source ' if maps.kind == CROSS else ''}token, one panel "
            f"per layer (rows: heads); right: the whole map of layer {layer}, {head_name(head)} ({who}). "
            + finding(maps, index, layer, head))


def draw_attention(maps: AttentionMaps, index: int, layer: int, head: int | None, out) -> None:
    """Per-layer head × key panels for query `index`, and the full T × S map of (layer, head)
    (head None: the mean of the layer's heads)."""
    from matplotlib.colors import PowerNorm  # optional heavy dependency (viz extra)

    n_layers, n_heads, t, s = maps.weights.shape
    cols = min(n_layers, 6)
    rows = -(-n_layers // cols)
    height = max(2.4 + rows * (0.45 + 0.16 * n_heads), 2.4 + 0.22 * t)  # room for the map's T row labels
    fig = new_figure(min(18.0, 4.5 + 2.0 * cols + 0.18 * s), height)
    left, right = fig.subfigures(1, 2, width_ratios=[cols * (0.6 + 0.15 * s), 4 + 0.12 * s])
    norm = PowerNorm(0.5, vmin=0.0, vmax=1.0)
    axes = left.subplots(rows, cols, squeeze=False)
    image = None
    for lay, ax in enumerate(axes.flat):
        if lay >= n_layers:
            ax.axis("off")
            continue
        image = ax.imshow(maps.weights[lay, :, index, :], cmap="Blues", norm=norm, aspect="auto")
        ax.set_title(f"layer {lay}", fontsize=8)
        ax.set_yticks(range(0, n_heads, max(1, n_heads // 4)))
        ax.tick_params(labelsize=6)
        last_row = lay + cols >= n_layers
        ax.set_xticks(range(s), [short(k, 8) for k in maps.key_tokens] if last_row else [], rotation=90)
        if lay % cols == 0:
            ax.set_ylabel("head", fontsize=7)
    left.suptitle(f"query {maps.query_tokens[index].strip()!r} (position {index}): weight on each key token",
                  fontsize=9)
    left.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    ax = right.subplots()
    ax.imshow(head_map(maps, layer, head), cmap="Blues", norm=norm, aspect="auto")
    ax.set_xticks(range(s), [short(k) for k in maps.key_tokens], rotation=90, fontsize=7)
    ax.set_yticks(range(t), [short(q) for q in maps.query_tokens], fontsize=7)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (target token predicted)" if maps.kind == CROSS else "query (attending)")
    ax.axhline(index, color="#e76f51", lw=0.8)
    ax.set_title(f"layer {layer}, {head_name(head)}", fontsize=9)
    what = "cross-attention" if maps.kind == CROSS else "self-attention"
    title = f"Attention ({what}) of {_model_label(maps.model)}"
    finish(fig, title, caption(maps, index, layer, head), out)


def _model_label(name: str) -> str:
    return name.rstrip("/").split("/")[-1]
