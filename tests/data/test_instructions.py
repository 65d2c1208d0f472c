"""Instruction pairs as tokens (data/instructions.py) and the fine-tuning objective's loss
(tasks/instruction.py): the prompt's tokens carry no loss, a shared prefix computed once gives the
loss and gradients of the full rows, batches stay within their token budget."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.data.instructions import InstructionExamples, collate, common_prefix, length_batches
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn import recompute
from attnlab.nn.lora import apply_lora, lora_layers
from attnlab.tasks.instruction import response_logits
from attnlab.tokenizers import ByteLevelBPE

PREFIX = [7, 8, 9, 10]
EXAMPLES = InstructionExamples(
    prompts=[PREFIX + [11, 12, 3], PREFIX + [13, 3], PREFIX + [11, 14, 15, 3], PREFIX + [3]],
    responses=[[20, 21, 2], [22, 2], [23, 24, 25, 26, 2], [27, 2]])


def test_only_response_tokens_are_targets():
    for share in (False, True):
        b = collate(EXAMPLES, [0, 1, 2, 3], pad_id=0, share_prefix=share)
        assert b.n_targets == sum(map(len, EXAMPLES.responses))
        for row, response in enumerate(EXAMPLES.responses):
            assert b.targets[row][b.keep[row]].tolist() == response  # every response token, in order, nothing else
        full = [p + r for p, r in zip(EXAMPLES.prompts, EXAMPLES.responses)]
        for row, seq in enumerate(full):  # inputs are the sequence shifted: prefix + ids, then targets
            n = len(seq) - 1 - b.prefix.numel()
            assert b.prefix.tolist() + b.ids[row, :n].tolist() == seq[:-1]
            assert b.targets[row, :n].tolist() == seq[b.prefix.numel() + 1:]
    shared = collate(EXAMPLES, [0, 1, 2, 3], pad_id=0)
    assert shared.prefix.tolist() == PREFIX  # the common prefix, leaving each row its last prompt token
    assert collate(EXAMPLES, [3], pad_id=0).prefix.tolist() == PREFIX  # one example: all but its last prompt token
    assert common_prefix([[1, 2, 3], [1, 2], [1, 5]]) == 1


def _model() -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("llama", vocab_size=32, d_model=32, n_layers=2, n_heads=4, max_seq_len=32))
    apply_lora(model, ["q_proj", "v_proj", "up_proj"], rank=2, alpha=4)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.weight.normal_(0, 0.3)
    return model.train()


def _loss_and_grads(model, batch):
    model.zero_grad()
    logits = response_logits(model, batch)
    loss = F.cross_entropy(logits, batch.targets[batch.keep])
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_prompt_tokens_carry_no_loss():
    """The objective's loss is the cross-entropy of the response tokens of full-row logits, and the
    logits at prompt positions get no gradient from it."""
    model = _model()
    b = collate(EXAMPLES, [0, 1, 2, 3], pad_id=0, share_prefix=False)
    logits = model(b.ids).logits  # (B, T, V)
    logits.retain_grad()
    loss = F.cross_entropy(logits[b.keep], b.targets[b.keep])
    loss.backward()
    assert torch.allclose(loss, F.cross_entropy(response_logits(model, b), b.targets[b.keep]), atol=1e-6)
    assert float(logits.grad[~b.keep].abs().max()) == 0.0
    assert bool((logits.grad[b.keep].abs().sum(-1) > 0).all())  # every response position gets a gradient


def test_shared_prefix_gives_the_full_rows_loss_and_gradients():
    model = _model()
    full, full_grads = _loss_and_grads(model, collate(EXAMPLES, [0, 1, 2, 3], 0, share_prefix=False))
    shared, shared_grads = _loss_and_grads(model, collate(EXAMPLES, [0, 1, 2, 3], 0, share_prefix=True))
    assert abs(float(full - shared)) <= 1e-6
    assert full_grads.keys() == shared_grads.keys() and full_grads
    for name, g in full_grads.items():
        assert torch.allclose(shared_grads[name], g, atol=1e-6, rtol=1e-4), name
    assert model.caches is None  # the prefix's caches are dropped after the loss


def test_length_batches_respect_the_budget_and_the_seed():
    lengths = [3, 9, 4, 12, 7, 7, 2, 30, 5, 6] * 5
    batches = length_batches(lengths, batch_tokens=24, seed=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 24 for b in batches)
    assert batches == length_batches(lengths, 24, seed=3) and batches != length_batches(lengths, 24, seed=4)


def test_encode_cuts_after_the_stop_token_and_drops_long_pairs():
    tok = ByteLevelBPE.train(["hello there general kenobi"], 270, ["<|im_end|>"])
    stop = tok.token_to_id("<|im_end|>")
    examples, dropped = InstructionExamples.encode(tok, ["hello ", "hello " * 40], ["there<|im_end|>\n", "x"], stop,
                                                   max_len=40)
    assert dropped == 1 and len(examples) == 1
    assert examples.responses[0][-1] == stop and tok.decode(examples.responses[0]) == "there<|im_end|>"


def test_activation_checkpointing_gives_the_same_loss_and_gradients(monkeypatch):
    model = _model()
    batch = collate(EXAMPLES, [0, 1, 2, 3], 0, share_prefix=True)
    plain, plain_grads = _loss_and_grads(model, batch)
    model.checkpoint_layers = True
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        response_logits(model, batch)
    recomputed, grads = _loss_and_grads(model, batch)
    assert torch.equal(plain, recomputed)
    for name, g in plain_grads.items():
        assert torch.allclose(grads[name], g, atol=1e-7, rtol=1e-6), name
    model.checkpoint_layers = False
    unsaved = []
    pack = recompute._pack  # without checkpointing the model saves through nn/recompute.py's hooks

    def counting(t):
        packed = pack(t)
        if isinstance(packed, torch.Tensor):  # kept (not a recipe recomputed in the backward)
            unsaved.append(packed.numel())
        return packed

    monkeypatch.setattr(recompute, "_pack", counting)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: unsaved.append(t.numel()) or t, lambda t: t):
        response_logits(model, batch)
    assert sum(saved) < 0.6 * sum(unsaved)  # fewer activations kept (the parameters are among both)
