"""moe: how a trained mixture-of-experts model routes a text's tokens to its experts, layer by layer.

The choices are recorded from each MoE layer's router (capture.recorded_routing: the top-k of its
probabilities, as MixtureOfExperts.forward picks them). A text longer than the model's context is
read in consecutive windows of max_seq_len tokens.
Shape legend: L layers, E experts, N tokens, k experts per token.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnlab.errors import UserError
from attnlab.viz.capture import recorded_routing
from attnlab.viz.figure import finish, new_figure, short
from attnlab.viz.sources import Source
from attnlab.tasks.kinds import Kind

MOE_RUN = ("a mixture-of-experts run, e.g. attnlab train --recipe shakespeare-char --set n_experts=4 "
           "--set moe_top_k=1 --steps 600 --out runs/shakespeare-moe")


@dataclass
class MoEResult:
    model: str
    tokens: list[str]          # N display strings
    n_experts: int
    top_k: int
    counts: np.ndarray         # (L, E) tokens routed to each expert (each token counts once per chosen expert)
    first_choice: np.ndarray   # (L, N) each token's first-choice expert
    ids: list[int]             # N token ids

    @property
    def consistency(self) -> float:
        """Share of tokens whose first choice is the one most often made for that token id (mean over
        layers): 1.0 if routing depended on the token alone, lower where the context changes it."""
        same = 0
        ids = np.array(self.ids)
        for layer in self.first_choice:
            for token in np.unique(ids):
                same += np.bincount(layer[ids == token]).max()
        return same / self.first_choice.size

    @property
    def caption(self) -> str:
        share = self.counts.max(axis=1) / self.counts.sum(axis=1)
        busiest = int(np.argmax(share))
        return (f"{len(self.tokens)} tokens through {self.counts.shape[0]} MoE layers of {self.n_experts} experts "
                f"(top-{self.top_k}): the busiest expert takes {share.min():.0%}–{share.max():.0%} of a layer's "
                f"tokens (most uneven: layer {busiest}); right, each token's first choice. A token goes to its usual "
                f"expert {self.consistency:.0%} of the time ({1 / self.n_experts:.0%} would be chance): "
                f"routing follows "
                f"the token, and its context changes it.")


@torch.no_grad()
def moe_routing(source: Source, text: str) -> MoEResult:
    """Count the tokens each expert of each layer receives for `text`.

    Raises:
        ValueError: the model has no mixture-of-experts layers (naming what fits), or the text no token.
    """
    cfg = getattr(source.model, "cfg", None)
    if source.kind is not Kind.CAUSAL_LM or not getattr(cfg, "n_experts", 0):
        raise UserError(f"the moe figure needs {MOE_RUN}; {source.name} has no mixture-of-experts layers")
    ids = source.tokenizer.encode(text)
    if not ids:
        raise UserError("the text has no token the model's tokenizer knows")
    window = cfg.max_seq_len
    choices = []
    for start in range(0, len(ids), window):
        with recorded_routing(source.model) as records:
            source.model(torch.tensor([ids[start:start + window]]), logits_to_keep=1)
        choices.append(torch.stack(records))  # (L, n, k)
    chosen = torch.cat(choices, dim=1)  # (L, N, k)
    counts = torch.nn.functional.one_hot(chosen, cfg.n_experts).sum(dim=(1, 2))  # (L, E)
    return MoEResult(source.name, [source.display(i) for i in ids], cfg.n_experts, cfg.moe_top_k,
                     counts.numpy(), chosen[..., 0].numpy(), ids)


def draw_moe(r: MoEResult, out, shown: int = 64) -> None:
    from matplotlib.colors import ListedColormap  # optional heavy dependency (viz extra)

    layers, experts = r.counts.shape
    fig = new_figure(15, 2.2 + 0.55 * layers + 1.2)
    ax, bx = fig.subplots(1, 2, width_ratios=[1, 3.2])
    image = ax.imshow(r.counts, cmap="Oranges", aspect="auto")
    for (i, j), v in np.ndenumerate(r.counts):
        ax.text(j, i, str(v), ha="center", va="center", fontsize=8)
    ax.set_xticks(range(experts), [f"expert {e}" for e in range(experts)], fontsize=7, rotation=45)
    ax.set_yticks(range(layers), [f"layer {i}" for i in range(layers)], fontsize=8)
    ax.set_title(f"tokens routed to each expert ({len(r.tokens)} tokens, top-{r.top_k})", fontsize=9)
    fig.colorbar(image, ax=ax, shrink=0.7, label="tokens")
    n = min(shown, len(r.tokens))
    colors = ListedColormap([f"C{e}" for e in range(experts)])
    bx.imshow(r.first_choice[:, :n], cmap=colors, vmin=-0.5, vmax=experts - 0.5, aspect="auto")
    bx.set_xticks(range(n), [short(t, 6) for t in r.tokens[:n]], fontsize=7, family="monospace")
    bx.set_yticks(range(layers), [f"layer {i}" for i in range(layers)], fontsize=8)
    bx.set_xlabel("token (the first of the text)")
    bx.set_title("first-choice expert of each token (colour = expert)", fontsize=9)
    handles = [bx.scatter([], [], color=f"C{e}", marker="s", label=f"expert {e}") for e in range(experts)]
    bx.legend(handles=handles, fontsize=7, ncol=experts, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    finish(fig, f"Mixture-of-experts routing ({r.model.rstrip('/').split('/')[-1]})", r.caption, out)
