"""Applying learned BPE merges to one pre-token (Sennrich et al. 2016, section 3.2).

`ranks` maps an adjacent pair of token ids to (rank, merged id); a lower rank was learned earlier
and applies first. The order is the one of Hugging Face `tokenizers`' BPE model: always merge the
lowest-rank adjacent pair, the leftmost one among equals.
"""
from __future__ import annotations


def merge_word(word: list[int], left: int, right: int, new: int) -> list[int]:
    """Replace non-overlapping (left, right) occurrences in `word`, left to right, by `new`.

    Example: [a, a, a] with (a, a) -> [aa, a].
    """
    out, i, n = [], 0, len(word)
    while i < n:
        if i + 1 < n and word[i] == left and word[i + 1] == right:
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def apply_merges(ids: list[int], ranks: dict[tuple[int, int], tuple[int, int]]) -> list[int]:
    """Merge the ids of one pre-token until no adjacent pair has a rank.

    Args:
        ids: the pre-token's byte token ids.
        ranks: (left id, right id) -> (rank, merged id).
    Returns:
        The token ids.
    Occurrences of the chosen pair are merged left to right in one sweep, which stops early if a
    merge creates a pair of even lower rank (then the scan restarts). For merge lists learned by
    BPE (a token is always made before it is used) this is one sweep per merge; for any other
    list it still reproduces the priority-queue order exactly.
    """
    while len(ids) > 1:
        best, pos = None, -1
        for i, pair in enumerate(zip(ids, ids[1:])):
            found = ranks.get(pair)
            if found is not None and (best is None or found[0] < best[0]):
                best, pos = found, i
        if best is None:
            break
        rank, new = best
        a, b = ids[pos], ids[pos + 1]
        out, i, n = ids[:pos], pos, len(ids)
        while i < n:
            if i + 1 < n and ids[i] == a and ids[i + 1] == b:
                out.append(new)
                i += 2
                left = ranks.get((out[-2], new)) if len(out) > 1 else None
                right = ranks.get((new, ids[i])) if i < n else None
                if (left and left[0] < rank) or (right and right[0] < rank):
                    out.extend(ids[i:])
                    break
            else:
                out.append(ids[i])
                i += 1
        ids = out
    return ids
