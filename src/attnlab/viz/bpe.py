"""bpe: byte-pair-encoding merges step by step, the picture `attnlab tokenizer viz` draws
(tokenizers/viz.py), reachable as `attnlab viz bpe` and in the gallery."""
from __future__ import annotations

from attnlab.tokenizers.viz import MergeTrace, draw_trace, format_trace, merge_steps
from attnlab.viz.figure import shrink_png

DEFAULT_WORDS = "low lower newest widest newer wider"  # Sennrich et al. 2016's example, as `tokenizer viz`

__all__ = ["DEFAULT_WORDS", "bpe_merges", "caption", "draw_bpe", "format_trace"]


def bpe_merges(words: str = DEFAULT_WORDS, merges: int = 10) -> MergeTrace:
    """The merge trace of tokenizers.viz.merge_steps (the real trainer's merges)."""
    return merge_steps(words, merges)


def caption(trace: MergeTrace) -> str:
    first = trace.steps[0] if trace.steps else None
    made = f"first '{(first.left + first.right).decode('utf-8', 'replace')}' ({first.count} times)" if first else "none"
    return (f"Starting from bytes, BPE merges the most frequent adjacent pair again and again ({len(trace.steps)} "
            f"merges here, {made}); every word's segmentation shrinks as merges accumulate.")


def draw_bpe(trace: MergeTrace, out) -> None:
    """tokenizers.viz.draw_trace's figure, its PNG made smaller."""
    draw_trace(trace, out)
    if str(out).lower().endswith(".png"):
        shrink_png(out)
