"""context: one word's vector in two sentences, layer by layer (contextual embeddings).

A word enters an encoder as the same embedding row in any sentence; each layer mixes in its
neighbours, so "bank" by a river and "bank" with money drift apart. Drawn: the cosine similarity of
the word's hidden state in the two sentences at each layer, and, at the last layer, its similarity
to a few probe words (each encoded alone).

Shape legend: L layers, D model dim, P probe words.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from attnlab.errors import UserError
from attnlab.viz.attention import find_token
from attnlab.viz.capture import bert_hidden_states, token_embeddings
from attnlab.viz.figure import finish, new_figure
from attnlab.viz.sources import FITTING, Source
from attnlab.tasks.kinds import Kind

SENTENCES = ("The bank of the river.", "I deposited money at the bank.")
PROBES = ("river", "water", "money", "account")


@dataclass
class ContextResult:
    model: str
    word: str
    sentences: tuple[str, str]
    positions: tuple[int, int]     # the word's token position in each sentence
    layers: list[str]              # "token" (embedding row only), "embeddings" (+ positions, norm), "1".."L"
    cosine: list[float]            # the word's cosine similarity across the two sentences, per entry of layers
    probes: list[str]
    probe_cosine: np.ndarray       # (2, P) last-layer cosine of each sentence's word to each probe word

    def nearest(self, sentence: int) -> list[str]:
        """Probe words from nearest to farthest for sentence 0 or 1."""
        return [self.probes[i] for i in np.argsort(-self.probe_cosine[sentence])]

    @property
    def caption(self) -> str:
        emb, last = self.cosine[1], self.cosine[-1]
        return (f"The same word read in two sentences: its vectors start identical (token row: cosine "
                f"{self.cosine[0]:.2f}; {emb:.2f} once positions are added) and end at {last:.2f} after "
                f"{len(self.layers) - 2} layers; nearest probe words: {', '.join(self.nearest(0)[:2])} "
                f"(sentence 1) and {', '.join(self.nearest(1)[:2])} (sentence 2).")


def _word_vector(hidden: torch.Tensor, index: int) -> torch.Tensor:
    return hidden[0, index]


@torch.no_grad()
def context_similarity(source: Source, word: str = "bank", sentences: tuple[str, str] = SENTENCES,
                       probes: tuple[str, ...] = PROBES) -> ContextResult:
    """Cosine similarity of `word`'s hidden state in the two sentences at every layer.

    Raises:
        ValueError: a model that is not an encoder, or a word that is not one token of each sentence
            (listing the tokens).
    """
    if source.kind is not Kind.ENCODER:
        raise UserError(f"the context figure needs an encoder: {FITTING[Kind.ENCODER]}; {source.name} is "
                        f"{source.described}")
    states, positions = [], []
    for text in sentences:
        ids, tokens = source.tokenize(text)
        positions.append(find_token(tokens, word, "--word"))
        x = torch.tensor([ids])
        states.append([token_embeddings(source.model, x)] + bert_hidden_states(source.model, x))
    cosine = [float(F.cosine_similarity(_word_vector(a, positions[0]), _word_vector(b, positions[1]), dim=0))
              for a, b in zip(*states)]
    probe_vectors = []
    for probe in probes:
        ids, _ = source.tokenize(probe)
        hidden = bert_hidden_states(source.model, torch.tensor([ids]))[-1]
        probe_vectors.append(hidden[0, 1:-1].mean(0))  # the word's pieces, without [CLS] and [SEP]
    finals = torch.stack([_word_vector(s[-1], p) for s, p in zip(states, positions)])  # (2, D)
    probe_cos = F.cosine_similarity(finals[:, None], torch.stack(probe_vectors)[None], dim=-1)  # (2, P)
    n_layers = len(states[0]) - 2
    return ContextResult(source.name, word, tuple(sentences), tuple(positions),
                         ["token", "embeddings"] + [str(i) for i in range(1, n_layers + 1)], cosine,
                         list(probes), probe_cos.numpy())


def draw_context(result: ContextResult, out) -> None:
    fig = new_figure(11, 4.4)
    ax, bx = fig.subplots(1, 2, width_ratios=[1.3, 1])
    x = np.arange(len(result.layers))
    ax.plot(x, result.cosine, marker="o", color="#264653")
    for xi, c in zip(x, result.cosine):
        ax.annotate(f"{c:.2f}", (xi, c), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax.set_xticks(x, result.layers)
    ax.set_xlabel("layer (token = embedding row only; embeddings = + positions, LayerNorm)")
    ax.set_ylabel(f"cosine of {result.word!r} across the sentences")
    ax.set_ylim(min(0.0, min(result.cosine)) - 0.05, 1.1)
    ax.set_title(f"{result.sentences[0]!r} vs {result.sentences[1]!r}", fontsize=9)
    ax.grid(alpha=0.3)
    width = 0.38
    px = np.arange(len(result.probes))
    for k, color in ((0, "#2a9d8f"), (1, "#e76f51")):
        bx.bar(px + (k - 0.5) * width, result.probe_cosine[k], width, color=color,
               label=f"{result.word!r} in {result.sentences[k]!r}")
    bx.set_xticks(px, result.probes)
    bx.set_xlabel("probe word (encoded alone)")
    bx.set_ylabel("cosine at the last layer")
    bx.set_title("nearest probe words", fontsize=9)
    bx.set_ylim(min(0.0, float(result.probe_cosine.min())), float(result.probe_cosine.max()) * 1.35)
    bx.legend(fontsize=7, loc="upper right")
    bx.grid(alpha=0.3, axis="y")
    finish(fig, f"Contextual vectors: {result.word!r} layer by layer ({result.model})", result.caption, out)
