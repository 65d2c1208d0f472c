"""Autoregressive inference: greedy decoding and beam search for the encoder–decoder, and KV-cache
generation with sampling for decoder-only models (generate).

The encoder–decoder decoders encode each source once and decode incrementally with a KV cache
(DecodeState). Positions are owned here: the state's length is the position of the next token, and
generate() passes position_ids and the padding mask to the model.
Shape legend: B sentences, K beam size, S source length, P prompt length, V vocabulary.
"""
from __future__ import annotations

import torch

from attnlab.models.seq2seq import Seq2SeqTransformer


def _max_new_tokens(model: Seq2SeqTransformer, src: torch.Tensor, max_new_tokens: int | None) -> int:
    # Paper §6.1: maximum output length = input length + 50 (and within the model's positions).
    limit = model.cfg.max_seq_len - 1
    return min(limit, src.size(1) + 50 if max_new_tokens is None else max_new_tokens)


def _strip(ids: list[int], eos_id: int, pad_id: int) -> list[int]:
    out = []
    for t in ids:
        if t == eos_id:
            break
        if t != pad_id:
            out.append(t)
    return out


@torch.no_grad()
def greedy_decode(model: Seq2SeqTransformer, src: torch.Tensor, max_new_tokens: int | None = None
                  ) -> list[list[int]]:
    """Pick the most probable token at each step, for a whole batch at once.

    Finished sentences (those that produced <eos>) are dropped from the batch as they finish.

    Args:
        src: (B, S) int64 right-padded source ids.
        max_new_tokens: cap on generated tokens (default: S + 50, within max_seq_len).
    Returns:
        B lists of target ids, without <bos>/<eos>.
    """
    cfg = model.cfg
    n_new = _max_new_tokens(model, src, max_new_tokens)
    memory, src_mask = model.encode(src)
    state = model.start_decoding(memory, src_mask, n_new)
    rows = torch.arange(src.size(0))  # which original sentence each live row is
    out: list[list[int]] = [[] for _ in range(src.size(0))]
    tokens = torch.full((src.size(0), 1), cfg.bos_id, dtype=torch.long, device=src.device)
    for _ in range(n_new):
        h = model.decode(tokens, None, src_mask, state)  # (B_live, 1, D)
        nxt = model.output_logits(h[:, -1]).argmax(-1)  # (B_live,)
        for r, t in zip(rows.tolist(), nxt.tolist()):
            out[r].append(t)
        live = nxt != cfg.eos_id
        if not live.any():
            break
        if not live.all():
            keep = live.nonzero().squeeze(1)
            state.reorder(keep)
            rows, nxt = rows[keep], nxt[keep]
        tokens = nxt[:, None]
    return [_strip(o, cfg.eos_id, cfg.pad_id) for o in out]


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6)^α (Wu et al. 2016, eq. 14; α = 0.6 in the
    Transformer paper §6.1). Scores are log P(Y|X) / lp(Y)."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(model: Seq2SeqTransformer, src: torch.Tensor, beam_size: int = 4, alpha: float = 0.6,
                max_new_tokens: int | None = None) -> list[list[int]]:
    """Beam search with the GNMT length penalty, batched over sentences.

    At each step every live hypothesis is extended by every token; of the 2K best continuations per
    sentence, those ending in <eos> within the top K are finished (scored log P / lp), and the K best
    others stay alive. A sentence is done when it has K finished hypotheses and its best alive one,
    scored at the current length, does not beat the worst of them; at the length limit the alive ones
    are finished as they are.

    Args:
        src: (B, S) int64 right-padded source ids. beam_size: K >= 1. alpha: length-penalty α.
    Returns:
        B lists of target ids (the best finished hypothesis), without <bos>/<eos>.
    Raises:
        ValueError: if beam_size < 1.
    Source: Vaswani et al. 2017, §6.1 (beam 4, α 0.6); Wu et al. 2016 (length penalty).
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    cfg, k, b = model.cfg, beam_size, src.size(0)
    n_new = _max_new_tokens(model, src, max_new_tokens)
    memory, src_mask = model.encode(src)
    expand = torch.arange(b, device=src.device).repeat_interleave(k)  # (B·K,)
    state = model.start_decoding(memory.index_select(0, expand), src_mask.index_select(0, expand), n_new)
    scores = torch.full((b, k), float("-inf"), device=src.device)
    scores[:, 0] = 0.0  # all beams start identical: keep only one alive at first
    hyps = torch.full((b * k, 0), cfg.pad_id, dtype=torch.long, device=src.device)
    tokens = torch.full((b * k, 1), cfg.bos_id, dtype=torch.long, device=src.device)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
    done = [False] * b
    for step in range(1, n_new + 1):
        h = model.decode(tokens, None, src_mask, state)  # (B·K, 1, D)
        logp = model.output_logits(h[:, -1]).float().log_softmax(-1)  # (B·K, V)
        vocab = logp.size(-1)
        cand = (scores.view(b * k, 1) + logp).view(b, k * vocab)  # (B, K·V)
        top_scores, top_idx = cand.topk(2 * k, dim=1)  # (B, 2K)
        src_beam, tok = top_idx // vocab, top_idx % vocab
        next_beam = torch.zeros(b, k, dtype=torch.long)
        next_tok = torch.full((b, k), cfg.pad_id, dtype=torch.long)
        next_scores = torch.full((b, k), float("-inf"))
        ts, sb, tk = top_scores.tolist(), src_beam.tolist(), tok.tolist()
        for i in range(b):
            alive = 0
            for rank in range(2 * k):
                s, beam, t = ts[i][rank], sb[i][rank], tk[i][rank]
                if s == float("-inf") or done[i]:
                    break
                if t == cfg.eos_id:
                    if rank < k:
                        finished[i].append((s / length_penalty(step, alpha), hyps[i * k + beam].tolist()))
                    continue
                next_beam[i, alive], next_tok[i, alive], next_scores[i, alive] = beam, t, s
                alive += 1
                if alive == k:
                    break
            if not done[i] and len(finished[i]) >= k:
                best_alive = next_scores[i].max().item()
                worst = sorted(f[0] for f in finished[i])[-k]  # K-th best finished
                # stop when the best alive hypothesis, scored at the current length, cannot enter
                # the K best finished ones (the usual heuristic; the bound at the maximum length
                # would keep nearly every sentence running to the limit)
                if best_alive / length_penalty(step, alpha) <= worst:
                    done[i] = True
            if done[i]:
                next_scores[i] = float("-inf")
        if all(done):
            break
        index = (torch.arange(b)[:, None] * k + next_beam).view(-1)  # (B·K,) rows to keep
        state.reorder(index)
        hyps = torch.cat([hyps.index_select(0, index), next_tok.view(-1, 1)], dim=1)
        scores = next_scores
        tokens = next_tok.view(-1, 1)
    for i in range(b):
        if not done[i]:  # the length limit: alive hypotheses end here
            for j in range(k):
                if scores[i, j] > float("-inf"):
                    finished[i].append((scores[i, j].item() / length_penalty(hyps.size(1), alpha),
                                        hyps[i * k + j].tolist()))
    return [_strip(max(f, key=lambda x: x[0])[1], cfg.eos_id, cfg.pad_id) if f else [] for f in finished]


# ----------------------------------------------------------------------------- decoder-only models
def _left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) left-padded ids and (B, P) bool attention mask (True = real token)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool, device=device)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = True
    return ids, mask


def check_context(model, prompt_len: int, max_new_tokens: int) -> None:
    """Raise ValueError when prompt + new tokens exceed max_seq_len, unless the model has a sliding
    window and rotary positions (then the KV cache rolls and the context is unbounded) or is
    recurrent (a constant-size state and no positions: Mamba)."""
    cfg = model.cfg
    if getattr(model, "is_recurrent", False):
        return
    if cfg.sliding_window is not None and cfg.positions == "rope":
        return
    if prompt_len + max_new_tokens > cfg.max_seq_len:
        raise ValueError(f"the prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceed the model's "
                         f"max_seq_len={cfg.max_seq_len}; shorten the prompt or lower max_new_tokens")


@torch.no_grad()
def generate(model, prompts: list[list[int]], max_new_tokens: int = 128, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, stop_tokens: list[int] | None = None,
             seed: int | None = None, use_cache: bool = True, on_token=None) -> list[list[int]]:
    """Autoregressive generation for a decoder-only model (models.gpt.GPT), batched.

    Prompts of different lengths are left-padded; positions count real tokens only, and padding is
    masked out of attention. With use_cache the prompt is run once (prefill, in chunks for a rolling
    sliding-window cache) and each new token reuses the keys/values of all earlier ones; without it,
    the whole sequence is recomputed at every step (the O(n²)-per-token reference the cache must equal).

    Args:
        model: a GPT in eval mode. prompts: B non-empty lists of token ids.
        max_new_tokens: tokens to generate per prompt (fewer when a stop token comes).
        temperature, top_k, top_p: the sampling chain (sampling.sample_next); temperature 0 = greedy.
        stop_tokens: ids that end a sequence (default: the model's eos_id, if any); not returned.
        seed: seeds the sampling generator (same seed, same text); None = torch's global RNG.
        use_cache: decode with the KV cache (True) or recompute everything (False).
        on_token: called as on_token(row, token_id) for each generated token, as it is chosen.
    Returns:
        B lists of new token ids.
    Raises:
        ValueError: for an empty prompt list or prompt, an invalid sampling argument, or a context
            longer than max_seq_len (see check_context).
    """
    from attnlab.sampling import check_sampling, sample_next

    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (an empty prompt has nothing to continue)")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    check_sampling(temperature, top_k, top_p)
    check_context(model, max(len(p) for p in prompts), max_new_tokens)
    stop = set(stop_tokens if stop_tokens is not None else [t for t in [model.cfg.eos_id] if t is not None])
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    device = model.embed_tokens.weight.device
    ids, mask = _left_pad(prompts, 0, device)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, P): real tokens count from 0
    padded = not bool(mask.all())
    b = len(prompts)
    out: list[list[int]] = [[] for _ in range(b)]
    done = torch.zeros(b, dtype=torch.bool, device=device)
    try:
        if use_cache:
            model.setup_kv_cache(b, ids.size(1) + max_new_tokens)
            chunk = model.max_chunk or ids.size(1)
            for s in range(0, ids.size(1), chunk):
                logits = model(ids[:, s:s + chunk], mask[:, :s + chunk] if padded else None,
                               positions[:, s:s + chunk], logits_to_keep=1).logits[:, -1]
        for step in range(max_new_tokens):
            if not use_cache:
                logits = model(ids, mask if padded else None, positions, logits_to_keep=1).logits[:, -1]
            nxt = sample_next(logits, temperature, top_k, top_p, generator)  # (B,)
            for row in (~done).nonzero().flatten().tolist():
                token = int(nxt[row])
                if token in stop:
                    done[row] = True
                    continue
                out[row].append(token)
                if on_token is not None:
                    on_token(row, token)
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            new_pos = positions[:, -1:] + 1  # (B, 1)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            mask = torch.cat([mask, torch.ones(b, 1, dtype=torch.bool, device=device)], dim=1)
            positions = torch.cat([positions, new_pos], dim=1)
            if use_cache:
                logits = model(nxt[:, None], mask if padded else None, new_pos, logits_to_keep=1).logits[:, -1]
    finally:
        if use_cache:
            model.clear_kv_cache()
    return out
