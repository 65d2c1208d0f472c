"""Supervised fine-tuning of a chat model on instruction pairs: rendering a pair with the model's own
chat template, the objective the loop trains (cross-entropy of the response tokens only, the
batch's shared prompt prefix computed once), and completing prompts for evaluation.

Shape legend: B examples, P shared prefix, T row length after it, N response tokens, V vocabulary.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.chat import render_chat, stop_tokens
from attnlab.data.instructions import InstructionBatch, InstructionExamples, collate, length_batches
from attnlab.data.translation import read_parallel
from attnlab.errors import UserError
from attnlab.generate import generate
from attnlab.lm_beam import lm_beam_search
from attnlab.nn.linear_cross_entropy import linear_cross_entropy
from attnlab.nn.prefix_kv import SharedPrefixKV
from attnlab.seeding import mix_seed
from attnlab.tasks.language_model import special_strings
from attnlab.tasks.translation import corpus_bleu
from attnlab.train.losses import perplexity


def messages(instruction: str, system: str | None) -> list[dict]:
    """The conversation of one instruction: [system,] user."""
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": instruction}]


def render_prompt(template: str, special: dict, instruction: str, system: str | None) -> str:
    """The prompt text: the conversation up to the opening of the assistant's turn."""
    return render_chat(template, messages(instruction, system), True, special.get("bos", ""), special.get("eos", ""))


def render_pair(template: str, special: dict, instruction: str, response: str, system: str | None
                ) -> tuple[str, str]:
    """(prompt text, response text) of one pair: the response text is what the template writes
    for the assistant's turn after the prompt (the answer, its end-of-turn token and whatever follows).

    Raises:
        UserError: when the template's full conversation does not start with its generation prompt
            (a template that renders the last turn differently cannot be trained this way).
    """
    prompt = render_prompt(template, special, instruction, system)
    full = render_chat(template, messages(instruction, system) + [{"role": "assistant", "content": response}],
                       False, special.get("bos", ""), special.get("eos", ""))
    if not full.startswith(prompt):
        raise UserError("the chat template renders a conversation with an assistant turn differently from its "
                         "generation prompt; instruction pairs cannot be split into prompt and response with it")
    return prompt, full[len(prompt):]


def response_logits(model, batch: InstructionBatch, return_hidden: bool = False) -> torch.Tensor:
    """(N, V) logits of the batch's loss positions (batch.keep) (or with return_hidden their (N, D)
    final hidden states): one forward over the (B, T) rows; with a shared prefix, the (1, P) prefix
    first, its keys and values then attended by every row (nn/prefix_kv.py) at positions P.."""
    if not batch.prefix.numel():
        out = model(batch.ids, logits_to_keep=batch.keep, return_hidden=return_hidden)
        return out.hidden if return_hidden else out.logits
    model.set_kv_caches([SharedPrefixKV() for _ in model.layers])
    recompute = model.checkpoint_layers
    try:
        # The prefix's few positions keep their activations: a recomputed prefix layer would find its
        # own keys already cached (activation checkpointing recomputes the rows' layers only).
        model.checkpoint_layers = False
        model(batch.prefix[None], logits_to_keep=torch.zeros(1, batch.prefix.numel(), dtype=torch.bool))
        model.checkpoint_layers = recompute
        out = model(batch.ids, logits_to_keep=batch.keep, return_hidden=return_hidden)
        return out.hidden if return_hidden else out.logits
    finally:
        model.checkpoint_layers = recompute
        model.clear_kv_cache()


@torch.no_grad()
def complete(model, prompts: list[list[int]], stop: list[int], max_new_tokens: int, beam_size: int = 1,
             length_penalty: float = 0.6, batch_rows: int = 32) -> list[list[int]]:
    """The model's continuation of each prompt up to a stop token (not returned), in input order:
    greedy (beam_size 1) or beam search (lm_beam.lm_beam_search), in batches of prompts of similar
    length (batch_rows // beam_size each)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    n = max(1, batch_rows // beam_size)
    out: list[list[int]] = [[] for _ in prompts]
    for start in range(0, len(order), n):
        idx = order[start:start + n]
        group = [prompts[i] for i in idx]
        if beam_size == 1:
            new = generate(model, group, max_new_tokens, temperature=0.0, stop_tokens=stop)
        else:
            new = lm_beam_search(model, group, beam_size, max_new_tokens, stop, length_penalty)
        for i, ids in zip(idx, new):
            out[i] = ids
    return out


class InstructionObjective:
    """Training data, objective and validation of an instruction fine-tune, for the loop
    (train/loop.py): length-bucketed batches of about data_cfg.batch_tokens tokens, mean
    cross-entropy of the response tokens (label smoothing as set), validation loss on the response
    tokens and greedy BLEU of the completions against the references.

    Args:
        train, val: tokenized examples. val_refs: the validation references (BLEU). tokenizer: to
            decode completions. data_cfg: the task's data config (batch_tokens, share_prefix,
            label_smoothing, max_new_tokens). seed: the run's. pad_id: a padding id. stop: stop ids.
        share_prefix: compute a batch's shared prompt prefix once (None: data_cfg.share_prefix).
    """

    best_metric, higher_is_better, leaves_parameters_unused = "val_bleu", True, False

    def __init__(self, train: InstructionExamples, val: InstructionExamples, val_refs: list[str], tokenizer,
                 data_cfg, seed: int, pad_id: int, stop: list[int], share_prefix: bool | None = None):
        self.train, self.val, self.val_refs, self.tokenizer = train, val, val_refs, tokenizer
        self.data_cfg, self.seed, self.pad_id, self.stop = data_cfg, seed, pad_id, stop
        self.share_prefix = data_cfg.share_prefix if share_prefix is None else share_prefix

    def batches(self, epoch: int) -> list[list[int]]:
        return length_batches(self.train.lengths(), self.data_cfg.batch_tokens, mix_seed(self.seed, epoch))

    def batch_rows(self, batch: list[int]) -> int:
        return len(batch)

    def shard(self, batch: list[int], rows: range) -> list[int]:
        """The examples `rows` of a batch (a process's part of it, data/sharding.py)."""
        return batch[rows.start:rows.stop]

    def loss(self, model, batch: list[int]) -> tuple[torch.Tensor, int]:
        """Mean cross-entropy over the response tokens of the examples `batch`, and their count: the
        output projection and the loss in chunks of positions (nn/linear_cross_entropy.py), so
        that no (N, V) logits are kept for the backward."""
        b = collate(self.train, batch, self.pad_id, self.share_prefix)
        hidden = response_logits(model, b, return_hidden=True)
        return linear_cross_entropy(hidden, model.lm_head, b.targets[b.keep], self.data_cfg.label_smoothing), \
            b.n_targets

    @torch.no_grad()
    def evaluate(self, model) -> dict:
        """{"val_loss" (nats per response token, no smoothing), "val_ppl", "val_bleu" (greedy)} on
        the validation examples."""
        total, count = 0.0, 0
        for index in length_batches(self.val.lengths(), self.data_cfg.batch_tokens, seed=0):
            b = collate(self.val, index, self.pad_id, self.share_prefix)
            total += F.cross_entropy(response_logits(model, b).float(), b.targets[b.keep], reduction="sum").item()
            count += b.n_targets
        hyps = self.decode(model, self.val.prompts)
        nll = total / max(count, 1)
        return {"val_loss": round(nll, 4), "val_ppl": round(perplexity(nll), 2),
                "val_bleu": round(corpus_bleu(hyps, self.val_refs), 2)}

    def decode(self, model, prompts: list[list[int]], beam_size: int = 1) -> list[str]:
        """The completions of tokenized prompts as text (stripped)."""
        ids = complete(model, prompts, self.stop, self.data_cfg.max_new_tokens, beam_size,
                       self.data_cfg.length_penalty)
        return [self.tokenizer.decode(t).strip() for t in ids]


def translation_bleu(model, tokenizer, template: str, data, split: str | None = None,
                     limit: int | None = None, beam: int | None = None) -> dict:
    """sacreBLEU of a chat model's completions of `data`'s instructions (tasks.finetune's
    InstructionDataConfig) on a split ("test" = the data's test split, "val", "train"; the first
    `limit` pairs), greedy or with `beam` (default data.beam_size), against the raw references: a
    fine-tune's evaluation, or a base model's zero-shot.

    Returns:
        {"split", "n", "bleu", "beam"}.
    Raises:
        UserError: for an unknown split.
    """
    splits = {"train": "train", "val": "val", "test": data.test_split, data.test_split: data.test_split}
    split = split or "test"
    if split not in splits:
        raise UserError(f"unknown split {split!r}; known: train, val, test (= {data.test_split})")
    src, refs = read_parallel(data.dataset, splits[split], data.src_lang, data.tgt_lang)
    src, refs = src[:limit], refs[:limit]
    special = special_strings(tokenizer, model.cfg)
    prompts = tokenizer.encode_batch([render_prompt(template, special, data.instruction.format(source=s), data.system)
                                      for s in src], allowed_special="all")
    stop = stop_tokens(tokenizer, model.cfg.eos_id)
    empty = InstructionExamples([], [])
    beam = beam or data.beam_size
    hyps = InstructionObjective(empty, empty, [], tokenizer, data, 0, 0, stop).decode(model, prompts, beam)
    return {"split": splits[split], "n": len(src), "bleu": round(corpus_bleu(hyps, refs), 2), "beam": beam}
