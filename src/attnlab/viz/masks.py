"""masks: the boolean attention masks of a real padded Multi30k batch, True = may attend.

Built by nn/masks.py exactly as the models build them: the encoder's key-padding mask, the
decoder's causal ∧ target-padding mask, the cross-attention mask (source padding) and a causal
sliding window (Mistral), each expanded to the query × key grid it acts on.
Shape legend: B sentences, S source length, T decoder input length (<bos> + target).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnlab.data.translation import pad_batch
from attnlab.errors import UserError
from attnlab.nn.masks import causal_mask, padding_mask
from attnlab.viz.figure import finish, new_figure, short


@dataclass
class MasksResult:
    sources: list[str]             # the B English sentences
    src_tokens: list[list[str]]    # per sentence, its tokens (unpadded)
    tgt_tokens: list[list[str]]    # per sentence, <bos> + target tokens (unpadded)
    src: np.ndarray                # (B, S) int64 right-padded source ids
    tgt_in: np.ndarray             # (B, T) int64 right-padded decoder inputs
    encoder: np.ndarray            # (B, S, S) bool
    decoder: np.ndarray            # (B, T, T) bool
    cross: np.ndarray              # (B, T, S) bool
    window: np.ndarray             # (T, T) bool, causal with a sliding window
    window_size: int
    pad_id: int
    row: int                       # the sentence drawn in detail (the shortest source: most padding)

    @property
    def caption(self) -> str:
        b = self.row
        return (f"Filled = True = may attend. Padding keys are hidden from every query (the padded columns), "
                f"the decoder also hides the future (only the lower triangle is filled), cross-attention "
                f"lets each target position see the {len(self.src_tokens[b])} real source tokens, and a window "
                f"of {self.window_size} keeps only the most recent keys.")


def batch_masks(tokenizer, sources: list[str], targets: list[str], pad_id: int, bos_id: int,
                window_size: int = 4) -> MasksResult:
    """Tokenize a batch of sentence pairs, pad it as training does, and build its masks.

    Raises:
        ValueError: for an empty batch or window_size < 1.
    """
    if not sources:
        raise UserError("the masks figure needs at least one sentence pair")
    src_ids = tokenizer.encode_batch(sources)
    tgt_ids = [[bos_id] + t for t in tokenizer.encode_batch(targets)]
    src, tgt_in = pad_batch(src_ids, pad_id), pad_batch(tgt_ids, pad_id)
    b, s, t = src.size(0), src.size(1), tgt_in.size(1)
    encoder = padding_mask(src, pad_id).expand(b, 1, s, s)[:, 0]  # (B, S, S): every query, the real keys
    decoder = (causal_mask(t) & padding_mask(tgt_in, pad_id))[:, 0]  # (B, T, T)
    cross = padding_mask(src, pad_id).expand(b, 1, t, s)[:, 0]  # (B, T, S)
    window = causal_mask(t, window=window_size)[0, 0]  # (T, T)
    show = lambda ids: [tokenizer.token_bytes(i).decode("utf-8", "backslashreplace") for i in ids]  # noqa: E731
    specials = {v: k for k, v in tokenizer.special_tokens.items()}
    tgt_tokens = [[specials.get(i) or show([i])[0] for i in ids] for ids in tgt_ids]
    row = min(range(b), key=lambda i: len(src_ids[i]))
    return MasksResult(sources, [show(x) for x in src_ids], tgt_tokens, src.numpy(), tgt_in.numpy(),
                       encoder.numpy(), decoder.numpy(), cross.numpy(), window.numpy(), window_size, pad_id, row)


def draw_masks(r: MasksResult, out) -> None:
    from matplotlib.colors import ListedColormap  # optional heavy dependency (viz extra)

    cmap = ListedColormap(["#eeeeee", "#2a9d8f"])
    b = r.row
    src = [short(x, 8) for x in r.src_tokens[b]] + ["<pad>"] * (r.src.shape[1] - len(r.src_tokens[b]))
    tgt = [short(x, 8) for x in r.tgt_tokens[b]] + ["<pad>"] * (r.tgt_in.shape[1] - len(r.tgt_tokens[b]))
    fig = new_figure(15, 8.5)
    top, bottom = fig.subfigures(2, 1, height_ratios=[1, 2.4])
    ax = top.subplots()
    ax.imshow(r.src != r.pad_id, cmap=cmap, vmin=0, vmax=1, aspect="auto")
    ax.set_yticks(range(len(r.sources)), [short(x, 34) for x in r.sources], fontsize=7)
    ax.set_xlabel("source position (grey: <pad>)")
    ax.set_title(f"the padded batch: {r.src.shape[0]} Multi30k sentences, right-padded to {r.src.shape[1]} tokens",
                 fontsize=9)
    panels = [("encoder self-attention: padding", r.encoder[b], src, src),
              ("decoder self-attention: causal ∧ padding", r.decoder[b], tgt, tgt),
              ("cross-attention: source padding", r.cross[b], tgt, src),
              (f"sliding window W = {r.window_size} (causal)", r.window, tgt, tgt)]
    for ax, (title, mask, rows, cols) in zip(bottom.subplots(1, 4), panels):
        ax.imshow(mask, cmap=cmap, vmin=0, vmax=1)
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=6)
        ax.set_yticks(range(len(rows)), rows, fontsize=6)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    bottom.suptitle(f"masks of sentence {b + 1}: {r.sources[b]!r}", fontsize=9)
    finish(fig, "Attention masks (bool, True = may attend)", r.caption, out)
