"""Learning BPE merges from pre-token counts, with incremental pair-count updates.

Algorithm (Sennrich et al. 2016, "Neural Machine Translation of Rare Words with Subword Units",
Algorithm 1, on bytes as in Radford et al. 2019): every distinct pre-token is a "word", a list of
token ids starting from its UTF-8 bytes, weighted by how often it occurs. Repeatedly merge the most
frequent adjacent pair of tokens into a new token.

Instead of recounting all pairs after every merge, we keep
    pair_counts: pair -> weighted count,
    where:       pair -> ids of the words that contain it (may hold stale ids, re-checked),
    a max-heap of (count, pair) with lazy invalidation (a popped entry whose count is out of date
    is pushed back with the current count),
and after a merge only re-scan the words that contained the merged pair.

Tie-break (independent of input order): the highest count wins; among equal counts, the pair whose
(left token bytes, right token bytes) is lexicographically smallest (Python `bytes` order) wins.
Overlapping occurrences count separately ("aaa" holds the pair (a, a) twice) and a merge replaces
non-overlapping occurrences from left to right ("aaa" -> "aa", "a").
A pair whose concatenation already exists as a token is never merged (it is dropped), so every
merge creates a new, distinct token; this keeps `tokenizer.json` vocab strings unique.
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from typing import Mapping

from .merge import merge_word


def learn_merges(
    word_counts: Mapping[bytes, int], n_tokens: int, min_frequency: int = 2
) -> list[tuple[int, int]]:
    """Learn up to `n_tokens` merges over words given as UTF-8 bytes with their counts.

    Token ids are local: 0..255 are the bytes, merge k creates token 256 + k.

    Args:
        word_counts: distinct pre-token bytes -> number of occurrences (> 0).
        n_tokens: maximum number of merges (new tokens) to learn; <= 0 learns none.
        min_frequency: stop as soon as the best pair occurs fewer times than this.
    Returns:
        The merges in order, as (left id, right id) pairs of local ids.
    Source: Sennrich et al. 2016, Algorithm 1 (with incremental counts and a heap).
    """
    words = [list(w) for w in word_counts]
    freqs = list(word_counts.values())
    token_bytes = [bytes([b]) for b in range(256)]
    known = set(token_bytes)
    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)
    for wid, (word, freq) in enumerate(zip(words, freqs)):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += freq
            where[pair].add(wid)
    heap = [(-c, token_bytes[a], token_bytes[b], a, b) for (a, b), c in pair_counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[int, int]] = []
    while len(merges) < n_tokens and heap:
        neg, _, _, a, b = heapq.heappop(heap)
        count = pair_counts.get((a, b), 0)
        if count != -neg:  # stale entry: re-queue with the current count
            if count > 0:
                heapq.heappush(heap, (-count, token_bytes[a], token_bytes[b], a, b))
            continue
        if count < min_frequency:
            break
        merged = token_bytes[a] + token_bytes[b]
        if merged in known:  # would duplicate a token: drop this pair for good
            del pair_counts[(a, b)]
            continue
        new = len(token_bytes)
        token_bytes.append(merged)
        known.add(merged)
        merges.append((a, b))
        _apply_merge(words, freqs, pair_counts, where, heap, token_bytes, a, b, new)
    return merges


def _apply_merge(words, freqs, pair_counts, where, heap, token_bytes, a, b, new) -> None:
    """Merge (a, b) -> new in every word that holds it; update counts, `where` and the heap."""
    delta: dict[tuple[int, int], int] = defaultdict(int)
    for wid in where.pop((a, b), ()):
        word = words[wid]
        merged = merge_word(word, a, b, new)
        if len(merged) == len(word):  # stale `where` entry
            continue
        freq = freqs[wid]
        for pair in zip(word, word[1:]):
            delta[pair] -= freq
        for pair in zip(merged, merged[1:]):
            delta[pair] += freq
            if new in pair:
                where[pair].add(wid)
        words[wid] = merged
    for pair, d in delta.items():
        if d == 0:
            continue
        count = pair_counts.get(pair, 0) + d
        if count > 0:
            pair_counts[pair] = count
        else:
            pair_counts.pop(pair, None)
        if d > 0:  # only pairs holding `new` grow; others keep a (higher) stale heap entry
            heapq.heappush(heap, (-count, token_bytes[pair[0]], token_bytes[pair[1]], *pair))
