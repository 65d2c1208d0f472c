"""Showing BPE merges step by step on a word list (text, and a matplotlib figure).

The classic example (Sennrich et al. 2016, section 3.2): over "low lower newest widest newer
wider", the most frequent adjacent pair is merged first ("e" + "r" -> "er"), then the next, and
every word's segmentation changes as merges accumulate. The merges come from the real trainer
(`trainer.learn_merges`, same tie-break: highest count, then smallest (left, right) bytes); each
word is one pre-token (split on whitespace; no leading space), weighted by how often it occurs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .merge import merge_word
from .trainer import learn_merges

from attnlab.errors import UserError


@dataclass
class MergeStep:
    """One merge: the pair, its count before merging, every word's tokens after it."""

    left: bytes
    right: bytes
    count: int  # weighted occurrences, overlapping ones counted separately (as the trainer)
    segmentations: list[list[bytes]]  # per distinct word, in first-seen order


@dataclass
class MergeTrace:
    """The words, their counts, their segmentation into bytes, and the merge steps."""

    words: list[str]
    counts: list[int]
    initial: list[list[bytes]]
    steps: list[MergeStep]


def merge_steps(words: str | Sequence[str], n_merges: int = 10) -> MergeTrace:
    """Learn up to `n_merges` BPE merges on `words` and record every step.

    Args:
        words: a whitespace-separated string or a list of words; repeats raise a word's count.
        n_merges: how many merges to learn (fewer when no adjacent pair is left).
    Returns:
        The trace; `format_trace` prints it, `draw_trace` draws it.
    Raises:
        ValueError: no words, or n_merges < 0.
    Source: Sennrich et al. 2016, Algorithm 1 and its example.
    """
    items = words.split() if isinstance(words, str) else [w for w in words if w]
    if not items:
        raise UserError("viz needs at least one word, e.g. --words \"low lower newest\"")
    if n_merges < 0:
        raise UserError(f"n_merges must be >= 0, got {n_merges}")
    counts: dict[bytes, int] = {}
    for word in items:
        key = word.encode("utf-8")
        counts[key] = counts.get(key, 0) + 1
    merges = learn_merges(counts, n_merges, min_frequency=1)
    token_bytes = [bytes([b]) for b in range(256)]
    segs = [list(w) for w in counts]
    initial = [[token_bytes[i] for i in seg] for seg in segs]
    steps = []
    for a, b in merges:
        new = len(token_bytes)
        token_bytes.append(token_bytes[a] + token_bytes[b])
        count = sum(n * sum(1 for pair in zip(seg, seg[1:]) if pair == (a, b))
                    for seg, n in zip(segs, counts.values()))
        segs = [merge_word(seg, a, b, new) for seg in segs]
        steps.append(MergeStep(token_bytes[a], token_bytes[b], count,
                               [[token_bytes[i] for i in seg] for seg in segs]))
    return MergeTrace([w.decode("utf-8") for w in counts], list(counts.values()), initial, steps)


def show(token: bytes) -> str:
    """A token for display: its text, or \\xNN escapes for bytes cut from a character."""
    return token.decode("utf-8", errors="backslashreplace")


def _segmentation(seg: list[list[bytes]]) -> str:
    return " | ".join(" ".join(show(t) for t in word) for word in seg)


def format_trace(trace: MergeTrace) -> str:
    """The trace as text: a header, step 0 (bytes), then one line per merge.

    Example line: `step 1: 'e' + 'r' -> 'er' (count 3): l o w | l o w er | ...`
    """
    counted = [f"{w} x{n}" if n > 1 else w for w, n in zip(trace.words, trace.counts)]
    lines = [f"words: {' '.join(counted)}", f"step 0: {_segmentation(trace.initial)}"]
    for k, step in enumerate(trace.steps, 1):
        lines.append(f"step {k}: '{show(step.left)}' + '{show(step.right)}' -> "
                     f"'{show(step.left + step.right)}' (count {step.count}): "
                     f"{_segmentation(step.segmentations)}")
    return "\n".join(lines)


def draw_trace(trace: MergeTrace, out) -> None:
    """Draw the trace as a PNG (or any format matplotlib knows from the suffix of `out`).

    One row per step, one column per word; each token is a box, the token made by that row's
    merge is highlighted. matplotlib is imported here (the `viz` extra).
    Raises:
        ImportError: matplotlib is not installed.
    """
    # optional dependency (the viz extra)
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch

    rows = [("bytes", trace.initial, None)] + [
        (f"{show(s.left)} + {show(s.right)}  ({s.count})", s.segmentations, s.left + s.right)
        for s in trace.steps]
    widths = [max(sum(len(show(t)) + 1 for t in row[1][w]) for row in rows) + 2
              for w in range(len(trace.words))]
    label_w = max(len(r[0]) for r in rows) + 4
    total = label_w + sum(widths)
    fig = Figure(figsize=(max(6.0, 0.13 * total), 0.8 + 0.42 * len(rows)))
    ax = fig.add_axes((0.01, 0.01, 0.98, 0.98))
    ax.set_xlim(0, total)
    ax.set_ylim(len(rows) + 0.2, -1.5)
    ax.axis("off")
    x = label_w
    for w, word in enumerate(trace.words):
        ax.text(x + 1, -0.4, word, fontsize=9, fontweight="bold", va="center")
        x += widths[w]
    for r, (label, segs, made) in enumerate(rows):
        ax.text(0, r + 0.5, f"{r}. {label}", fontsize=8, va="center", family="monospace")
        x = label_w
        for w, tokens in enumerate(segs):
            cx = x + 1
            for token in tokens:
                text = show(token)
                color = "#f4a261" if made is not None and token == made else "#e9edf5"
                ax.add_patch(FancyBboxPatch((cx, r + 0.15), len(text) + 0.6, 0.7,
                                            boxstyle="round,pad=0.02,rounding_size=0.15",
                                            facecolor=color, edgecolor="#555555", lw=0.6))
                ax.text(cx + 0.3 + len(text) / 2, r + 0.5, text, fontsize=8, ha="center",
                        va="center", family="monospace")
                cx += len(text) + 1
            x += widths[w]
    ax.text(0, -1.1, "BPE merges, step by step (highlighted: the token made in that step)",
            fontsize=9, va="center")
    fig.savefig(out, dpi=130)
