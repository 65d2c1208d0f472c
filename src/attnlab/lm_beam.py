"""Beam search for decoder-only models (models.gpt.GPT) with the KV cache, batched over prompts.

Shape legend: B prompts, K beam size, L left-padded prompt length, V vocabulary.
The same search as generate.beam_search for the encoder–decoder (its scoring rule, length penalty
and stopping test, generate.best_reachable), over a prompt instead of a source: each prompt is run
once (prefill), its cache copied to its K beams, and each step extends every alive beam by one token.
"""
from __future__ import annotations

import torch

from attnlab.errors import UserError
from attnlab.generate import EARLY_STOPPING, best_reachable, extend_beams, length_penalty


def _left_padded(prompts: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long, device=device)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool, device=device)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = True
    return ids, mask  # (B, L) each


def _select(b: int, k: int, step: int, logp: torch.Tensor, scores: torch.Tensor, hyps: torch.Tensor, stop: set,
            finished: list, done: list, alpha: float):
    """One step's choice (generate.beam_search's rule): of the 2K best continuations per prompt,
    those ending in a stop token within the top K are finished, the K best others stay alive.
    Returns (next beam (B, K), next token (B, K), next scores (B, K))."""
    vocab = logp.size(-1)
    top_scores, top_idx = (scores.view(b * k, 1) + logp).view(b, k * vocab).topk(2 * k, dim=1)  # (B, 2K)
    ts, sb, tk = top_scores.tolist(), (top_idx // vocab).tolist(), (top_idx % vocab).tolist()
    next_beam = torch.zeros(b, k, dtype=torch.long)
    next_tok = torch.zeros(b, k, dtype=torch.long)
    next_scores = torch.full((b, k), float("-inf"))
    for i in range(b):
        if not done[i]:
            extend_beams(zip(ts[i], sb[i], tk[i]), k, stop, step, alpha, lambda beam: hyps[i * k + beam].tolist(),
                         finished[i], next_beam[i], next_tok[i], next_scores[i])
    return next_beam, next_tok, next_scores


@torch.no_grad()
def lm_beam_search(model, prompts: list[list[int]], beam_size: int = 4, max_new_tokens: int = 128,
                   stop_tokens: list[int] | None = None, alpha: float = 0.6, early_stopping: str = "exact"
                   ) -> list[list[int]]:
    """Beam search with the GNMT length penalty for a decoder-only model (module docstring).

    Scoring rule: log P(Y | prompt) / lp(|Y|), |Y| counting the stop token; a hypothesis cut at
    max_new_tokens has |Y| = max_new_tokens. A prompt is done when it has K finished hypotheses and
    no alive one can beat the K-th best (best_reachable, "exact" or "heuristic").

    Args:
        model: a GPT in eval mode. prompts: B non-empty lists of ids. beam_size: K >= 1.
        max_new_tokens: the length limit. stop_tokens: ids that end a hypothesis (default: eos_id).
        alpha: length-penalty α.
    Returns:
        B lists of new ids (the best finished hypothesis), without the stop token.
    Raises:
        UserError: for beam_size < 1, max_new_tokens < 1, an empty prompt or an unknown early_stopping.
    Source: Wu et al. 2016, §7 (length penalty); Vaswani et al. 2017, §6.1.
    """
    if beam_size < 1 or max_new_tokens < 1 or not prompts or not all(prompts):
        raise UserError(f"need beam_size >= 1, max_new_tokens >= 1 and non-empty prompts, got beam_size={beam_size}, "
                         f"max_new_tokens={max_new_tokens}")
    if early_stopping not in EARLY_STOPPING:
        raise UserError(f"early_stopping must be one of {EARLY_STOPPING}, got {early_stopping!r}")
    stop = set(stop_tokens if stop_tokens is not None else [model.cfg.eos_id])
    k, b = beam_size, len(prompts)
    ids, mask = _left_padded(prompts, next(model.parameters()).device)
    padded = not bool(mask.all())
    expand = torch.arange(b).repeat_interleave(k)  # (B·K,)
    model.setup_kv_cache(b * k, ids.size(1) + max_new_tokens)
    try:
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        logits = model(ids[expand], mask[expand] if padded else None, positions[expand], logits_to_keep=1).logits[:, -1]
        mask = mask[expand]
        scores = torch.full((b, k), float("-inf"))
        scores[:, 0] = 0.0  # the K beams start identical: one alive at first
        hyps = torch.zeros(b * k, 0, dtype=torch.long)
        finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
        done = [False] * b
        for step in range(1, max_new_tokens + 1):
            next_beam, next_tok, next_scores = _select(b, k, step, logits.float().log_softmax(-1), scores, hyps, stop,
                                                       finished, done, alpha)
            for i in range(b):
                if not done[i] and len(finished[i]) >= k:
                    worst = sorted(f[0] for f in finished[i])[-k]
                    if best_reachable(next_scores[i].max().item(), step, max_new_tokens, alpha, early_stopping) <= worst:
                        done[i] = True
                if done[i]:
                    next_scores[i] = float("-inf")
            if all(done) or step == max_new_tokens:
                scores, hyps = next_scores, torch.cat([hyps[(torch.arange(b)[:, None] * k + next_beam).view(-1)],
                                                       next_tok.view(-1, 1)], dim=1)
                break
            index = (torch.arange(b)[:, None] * k + next_beam).view(-1)  # (B·K,) rows kept
            for cache in model.caches:
                cache.reorder(index)
            hyps = torch.cat([hyps[index], next_tok.view(-1, 1)], dim=1)
            mask = torch.cat([mask[index], torch.ones(b * k, 1, dtype=torch.bool)], dim=1)
            new_pos = mask.long().sum(-1, keepdim=True) - 1  # (B·K, 1)
            scores = next_scores
            logits = model(next_tok.view(-1, 1), mask if padded else None, new_pos, logits_to_keep=1).logits[:, -1]
    finally:
        model.clear_kv_cache()
    for i in range(b):  # the length limit: alive hypotheses end here
        if not done[i]:
            for j in range(k):
                if scores[i, j] > float("-inf"):
                    finished[i].append((scores[i, j].item() / length_penalty(hyps.size(1), alpha),
                                        hyps[i * k + j].tolist()))
    return [max(f, key=lambda x: x[0])[1] if f else [] for f in finished]
