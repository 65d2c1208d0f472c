"""Autoregressive inference: greedy decoding and beam search for the encoder–decoder, and KV-cache
generation with sampling for decoder-only models (generate).

The encoder–decoder decoders encode each source once and decode incrementally with a KV cache
(DecodeState). Positions are owned here: the state's length is the position of the next token, and
generate() passes position_ids and the padding mask to the model; past the context length it
conditions on the most recent max_seq_len tokens (context_window).
Shape legend: B sentences, K beam size, S source length, P prompt length, V vocabulary,
C context window (the last C columns a decoder-only model is run on).
"""
from __future__ import annotations

import torch

from attnlab import sampling
from attnlab.engines import choose_engine, context_limit
from attnlab.errors import UserError
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


EARLY_STOPPING = ("exact", "heuristic")


def best_reachable(log_prob: float, length: int, max_length: int, alpha: float, early_stopping: str) -> float:
    """The highest score that an alive hypothesis (log P = log_prob <= 0 after `length` tokens) may
    still reach, as beam_search's stopping test sees it.

    "exact": an upper bound. Log-probabilities only fall, and lp is monotone in the length
    (increasing for α > 0, decreasing for α < 0), so no continuation, finished at any length in
    length + 1 .. max_length, scores above log_prob / max(lp(length + 1), lp(max_length)); for α > 0
    that is the maximum length, as tensor2tensor's beam search (its lower bound divides by the
    penalty at decode_length) and Hugging Face's early_stopping="never" (huggingface/transformers#20901).
    "heuristic": log_prob / lp(length), the score if it ended now, as Hugging Face's
    early_stopping=False; a longer hypothesis may still beat it when α > 0.
    """
    if early_stopping == "heuristic":
        return log_prob / length_penalty(length, alpha)
    return log_prob / max(length_penalty(length + 1, alpha), length_penalty(max_length, alpha))


def extend_beams(ranked, k: int, stop, step: int, alpha: float, hyp, finished: list,
                 next_beam: torch.Tensor, next_tok: torch.Tensor, next_scores: torch.Tensor) -> None:
    """One beam-search step of one sentence (or prompt), shared by beam_search and
    lm_beam.lm_beam_search. `ranked`: its 2K best continuations, best first, as (summed
    log-probability, source beam, token). One ending in a `stop` token within the top K is finished:
    (score / lp(step), hyp(beam)) is appended to `finished` (hyp(beam): that beam's tokens so far,
    a list). The K best others stay alive, written into next_beam, next_tok, next_scores (each (K,);
    rows left as they were when fewer remain). Taking 2K candidates leaves K alive ones even when K
    of them end (Wu et al. 2016, §7; tensor2tensor's beam search)."""
    alive = 0
    for rank, (s, beam, t) in enumerate(ranked):
        if s == float("-inf"):
            break
        if t in stop:
            if rank < k:
                finished.append((s / length_penalty(step, alpha), hyp(beam)))
            continue
        next_beam[alive], next_tok[alive], next_scores[alive] = beam, t, s
        alive += 1
        if alive == k:
            break


@torch.no_grad()
def beam_search(model: Seq2SeqTransformer, src: torch.Tensor, beam_size: int = 4, alpha: float = 0.6,
                max_new_tokens: int | None = None, early_stopping: str = "exact") -> list[list[int]]:
    """Beam search with the GNMT length penalty, batched over sentences.

    Scoring rule: score(Y) = log P(Y|X) / lp(|Y|), |Y| counting the closing <eos>; a hypothesis cut
    at the length limit n (max_new_tokens) has |Y| = n. At each step every live hypothesis is
    extended by every token; of the 2K best continuations per sentence, those ending in <eos> within
    the top K are finished, and the K best others stay alive. A sentence is done when it has K
    finished hypotheses and no alive one can still beat the K-th best of them (best_reachable);
    at the length limit the alive ones are finished as they are.

    With early_stopping="exact" (the default) the stop never drops a hypothesis that could still
    win, so the result is the one the beam would reach by running to the length limit; when the
    beam is wide enough to keep every candidate it equals brute force under the scoring rule.
    "heuristic" stops once the best alive hypothesis, scored at its current length, cannot enter the
    K best; faster (for α > 0 the exact bound keeps most sentences running towards the limit), but
    with α > 0 it can miss a longer, better hypothesis (huggingface/transformers#20901).

    Args:
        src: (B, S) int64 right-padded source ids. beam_size: K >= 1. alpha: length-penalty α.
        max_new_tokens: the length limit n (default: S + 50, within max_seq_len).
        early_stopping: "exact" or "heuristic" (see above).
    Returns:
        B lists of target ids (the best finished hypothesis), without <bos>/<eos>.
    Raises:
        ValueError: if beam_size < 1 or early_stopping is not "exact" or "heuristic".
    Source: Vaswani et al. 2017, §6.1 (beam 4, α 0.6); Wu et al. 2016, §7 (length penalty);
        the stopping bounds of Hugging Face's BeamSearchScorer (early_stopping "never" / False).
    """
    if beam_size < 1:
        raise UserError(f"beam_size must be >= 1, got {beam_size}")
    if early_stopping not in EARLY_STOPPING:
        raise UserError(f"early_stopping must be 'exact' or 'heuristic', got {early_stopping!r}")
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
    live = list(range(b))  # the sentence in each of the batch's groups of K rows; done ones leave
    for step in range(1, n_new + 1):
        n = len(live)
        h = model.decode(tokens, None, src_mask, state)  # (N·K, 1, D), N sentences still running
        logp = model.output_logits(h[:, -1]).float().log_softmax(-1)  # (N·K, V)
        vocab = logp.size(-1)
        cand = (scores.view(n * k, 1) + logp).view(n, k * vocab)  # (N, K·V)
        top_scores, top_idx = cand.topk(2 * k, dim=1)  # (N, 2K)
        next_beam = torch.zeros(n, k, dtype=torch.long)
        next_tok = torch.full((n, k), cfg.pad_id, dtype=torch.long)
        next_scores = torch.full((n, k), float("-inf"))
        ts, sb, tk = top_scores.tolist(), (top_idx // vocab).tolist(), (top_idx % vocab).tolist()
        keep = []  # the groups that go on
        for i, sentence in enumerate(live):
            extend_beams(zip(ts[i], sb[i], tk[i]), k, (cfg.eos_id,), step, alpha,
                         lambda beam: hyps[i * k + beam].tolist(), finished[sentence],
                         next_beam[i], next_tok[i], next_scores[i])
            done = False
            if len(finished[sentence]) >= k:
                worst = sorted(f[0] for f in finished[sentence])[-k]  # K-th best finished
                best_alive = next_scores[i].max().item()  # −inf when none is left
                done = best_reachable(best_alive, step, n_new, alpha, early_stopping) <= worst
            if not done:
                keep.append(i)
        if not keep:
            break
        groups = torch.tensor(keep)
        index = (groups[:, None] * k + next_beam[groups]).view(-1)  # (N'·K,) rows to keep
        # a row moves only within its sentence's group unless a sentence left: the source side stays
        state.reorder(index, same_source=len(keep) == n)
        hyps = torch.cat([hyps.index_select(0, index), next_tok[groups].view(-1, 1)], dim=1)
        scores, tokens = next_scores[groups], next_tok[groups].view(-1, 1)
        live = [live[i] for i in keep]
    else:  # the length limit: the alive hypotheses of the sentences still running end here
        for i, sentence in enumerate(live):
            for j in range(k):
                if scores[i, j] > float("-inf"):
                    finished[sentence].append((scores[i, j].item() / length_penalty(hyps.size(1), alpha),
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


def context_window(model) -> int | None:
    """How many of the most recent positions generate() conditions each token on.

    None (every position) for a recurrent model (Mamba: a constant-size state, no positions) and for
    a model with a sliding window and rotary positions (its rolling KV cache holds only the window
    and RoPE needs no table): their context is unbounded. Otherwise cfg.max_seq_len: the rows of
    the learned or sinusoidal position table, or RoPE's trained length (engines.context_limit).
    """
    return context_limit(model)


def check_context(model, prompt_len: int, max_new_tokens: int) -> None:
    """Raise ValueError for an empty prompt (prompt_len < 1) or max_new_tokens < 1. No length is too
    long: past the model's context, generate() slides its window (context_window)."""
    if prompt_len < 1:
        raise UserError("every prompt needs at least one token (an empty prompt has nothing to continue)")
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens must be >= 1, got {max_new_tokens}")


def _window_logits(model, sequences: list[list[int]], window: int | None, device) -> torch.Tensor:
    """Next-token logits (N, V) from one uncached forward over the last `window` tokens of each
    sequence (all of them for None), left-padded, positions counting each row's tokens in the
    window from 0 (nanoGPT's crop to the last block_size tokens)."""
    ids, mask = _left_pad([s if window is None else s[-window:] for s in sequences], 0, device)  # (N, C) each
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # (N, C): real tokens count from 0
    padded = not bool(mask.all())
    return model(ids, mask if padded else None, positions, logits_to_keep=1).logits[:, -1]


@torch.no_grad()
def generate(model, prompts: list[list[int]], max_new_tokens: int = 128, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, stop_tokens: list[int] | None = None,
             seed: int | None = None, use_cache: bool = True, on_token=None, engine: str = "auto",
             kv_dtype: str = "auto") -> list[list[int]]:
    """Autoregressive generation for a decoder-only model (models.gpt.GPT, models.mamba.Mamba),
    batched, of any length.

    With use_cache each prompt is run once into its own slot of a decode engine (engines/: the
    fused C++ step where it applies, else the model's own forward; choose_engine's rule) and every
    step decodes one new token of each unfinished sequence, each at its own length and position.
    Without it, the whole window of every sequence is recomputed at every step in one left-padded
    uncached forward (the reference the cache must equal, token for token).

    Long generation: each token is conditioned on the most recent C = context_window(model)
    tokens, at positions 0..C−1 (a longer prompt is cut to its last C tokens). While a sequence
    fits in C its cache is used; once it is longer, each of its steps re-encodes its last C tokens
    in one uncached forward (absolute positions shift as the window slides, so no cached key stays
    valid): the same tokens as use_cache=False, at the cost of C positions per new token. Models with
    a sliding window and RoPE (C = None) instead keep rolling their cache over an unbounded context.

    Args:
        model: a GPT or Mamba in eval mode. prompts: B non-empty lists of token ids.
        max_new_tokens: tokens to generate per prompt (fewer when a stop token comes); any number.
        temperature, top_k, top_p: the sampling chain (sampling.sample_next); temperature 0 = greedy.
        stop_tokens: ids that end a sequence (default: the model's eos_id, if any); not returned.
        seed: seeds the sampling generator (same seed, same text); None = torch's global RNG.
        use_cache: decode with an engine's caches (True) or recompute the window at every step (False).
        on_token: called as on_token(row, token_id) for each generated token, as it is chosen.
        engine: "auto" (choose_engine's rule), "fused-cpp" or "reference" (engines/choose.py).
        kv_dtype: the fused engine's KV cache dtype: "auto" (fp16 for block-quantized weights, else
            fp32), "fp32" or "fp16" (engines/fused.py cache_dtype).
    Returns:
        B lists of new token ids.
    Raises:
        ValueError: for an empty prompt list or prompt, max_new_tokens < 1, an invalid sampling
            argument, an engine that does not run this model, or a kv_dtype it does not take.
    Source: Karpathy's nanoGPT, model.py GPT.generate ("if the sequence context is growing too long
        we must crop it at block_size"), used by its sample.py.
    """
    if not prompts:
        raise UserError("every prompt needs at least one token (an empty prompt has nothing to continue)")
    check_context(model, min(len(p) for p in prompts), max_new_tokens)
    sampling.check_sampling(temperature, top_k, top_p)
    stop = set(stop_tokens if stop_tokens is not None else [t for t in [model.cfg.eos_id] if t is not None])
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    device = next(model.parameters()).device
    window = context_window(model)
    sequences = [list(p if window is None else p[-window:]) for p in prompts]  # grow by one token per step
    b = len(prompts)
    out: list[list[int]] = [[] for _ in range(b)]
    done = [False] * b
    decoder = None
    if use_cache:
        longest = max(map(len, sequences)) + max_new_tokens
        decoder = choose_engine(model, b, longest if window is None else min(longest, window), engine, kv_dtype)
        logits = decoder.prefill(range(b), sequences)  # (B, V)
    else:
        logits = _window_logits(model, sequences, window, device)
    for step in range(max_new_tokens):
        nxt = sampling.sample_next(logits, temperature, top_k, top_p, generator).tolist()  # (B,)
        for row in range(b):
            if done[row]:
                continue
            if nxt[row] in stop:
                done[row] = True
                if decoder is not None:
                    decoder.release(row)
                continue
            out[row].append(nxt[row])
            sequences[row].append(nxt[row])
            if on_token is not None:
                on_token(row, nxt[row])
        if all(done) or step == max_new_tokens - 1:
            break
        live = [row for row in range(b) if not done[row]]
        if decoder is None:
            logits = _window_logits(model, sequences, window, device)
            continue
        cached = [row for row in live if window is None or len(sequences[row]) <= window]
        sliding = [row for row in live if row not in cached]  # past the context: one forward over the window
        if len(cached) == b:  # every row decodes in the engine: its logits are the step's
            logits = decoder.step(cached, [sequences[row][-1] for row in cached])
            continue
        logits = logits.clone()  # finished rows keep their (unused) logits
        if cached:
            logits[cached] = decoder.step(cached, [sequences[row][-1] for row in cached]).to(logits.dtype)
        if sliding:
            for row in sliding:
                decoder.release(row)
            logits[sliding] = _window_logits(model, [sequences[row] for row in sliding], window, device).to(logits.dtype)
    return out
