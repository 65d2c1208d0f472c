"""linear_cross_entropy (nn/linear_cross_entropy.py): the chunked head + cross-entropy gives
F.cross_entropy's loss (1e-6) and gradients (5e-6: fp32 summation order) of the composition, for a
frozen, a trained and a quantized head, with label smoothing (over all classes, or all but padding:
the translation loss), with a head tied to the embedding, and keeps no (N, V) tensor for the
backward; under CPU bf16 autocast, the composition under autocast up to bf16 rounding."""
from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab.nn.cross_entropy import label_smoothed_cross_entropy
from attnlab.nn.linear_cross_entropy import _fused, chunk_rows_for, linear_cross_entropy
from attnlab.nn.quant_linear import quantize_model


def case(trained: bool, n: int = 37, d: int = 32, vocab: int = 300):
    torch.manual_seed(0)
    head = nn.Linear(d, vocab, bias=False).requires_grad_(trained)
    hidden = torch.randn(n, d) * 2
    targets = torch.randint(0, vocab, (n,))
    return head, hidden, targets


def run(loss_fn, head, hidden, targets):
    h = hidden.clone().requires_grad_(True)
    loss = loss_fn(h)
    (loss * 3.0).backward()  # the loop back-propagates loss · count
    grad_w = None if head.weight.grad is None else head.weight.grad.clone()
    head.zero_grad(set_to_none=True)
    return loss.detach(), h.grad, grad_w


@pytest.mark.parametrize("trained", [False, True])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_loss_and_gradients_equal_the_composition(trained, epsilon):
    head, hidden, targets = case(trained)
    ours = run(lambda h: linear_cross_entropy(h, head, targets, epsilon, chunk_rows=8), head, hidden, targets)
    ref = run(lambda h: F.cross_entropy(head(h).float(), targets, label_smoothing=epsilon), head, hidden, targets)
    assert (ours[0] - ref[0]).abs() <= 1e-6 * ref[0].abs()
    for a, b in zip(ours[1:], ref[1:]):
        assert (a is None) == (b is None)
        if a is not None:  # fp32 sums over V = 300 in another order: an 8-row chunk's product takes
            # another BLAS kernel than the 37-row one (1.2e-6 of the largest on Intel Sapphire Rapids)
            assert (a - b).abs().max() <= 5e-6 * b.abs().max()


def test_a_quantized_head_equals_its_composition():
    model = nn.Sequential(nn.Linear(64, 96, bias=False))
    quantize_model(model, "q8_0")
    head = model[0]
    hidden, targets = torch.randn(20, 64), torch.randint(0, 96, (20,))
    h1, h2 = hidden.clone().requires_grad_(True), hidden.clone().requires_grad_(True)
    ours = linear_cross_entropy(h1, head, targets, chunk_rows=6)
    ref = F.cross_entropy(head(h2).float(), targets)
    ours.backward(), ref.backward()
    assert (ours - ref).abs() <= 1e-5 * ref.abs()
    assert (h1.grad - h2.grad).abs().max() <= 1e-4 * h2.grad.abs().max()  # bf16 input gradient of both


@pytest.mark.parametrize("trained", [False, True])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_under_bf16_autocast_it_equals_the_composition_under_autocast(trained, epsilon):
    # the products in bf16 as autocast runs the head, the softmax and the loss in fp32 on the
    # bf16-rounded logits (module docstring): the same loss (to fp32 summation order; compared in one
    # chunk, whose product is the composition's, since a chunk's product may take another bf16 kernel,
    # AMX or not, and round the odd logit the other way); the gradients (8-row chunks), rounded to bf16
    # at other points (the incoming gradient's scale, ∂/∂W's chunks), as close to the fp32 gradients
    # as the composition's are (within 1.5x; here ~0.5% of the largest both)
    head, hidden, targets = case(trained)
    targets = targets.clamp(min=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = run(lambda h: linear_cross_entropy(h, head, targets, epsilon, chunk_rows=8, pad_id=0), head, hidden,
                   targets)
        ref = run(lambda h: label_smoothed_cross_entropy(head(h), targets, epsilon, pad_id=0), head, hidden, targets)
        one_chunk = run(lambda h: linear_cross_entropy(h, head, targets, epsilon, chunk_rows=len(targets), pad_id=0),
                        head, hidden, targets)
    fp32 = run(lambda h: label_smoothed_cross_entropy(head(h), targets, epsilon, pad_id=0), head, hidden, targets)
    assert (one_chunk[0] - ref[0]).abs() <= 1e-6 * ref[0].abs()
    assert (one_chunk[0] - fp32[0]).abs() > 1e-6 * fp32[0].abs()  # the products did run in bf16
    assert (ours[0] - ref[0]).abs() <= 1e-4 * ref[0].abs()  # 8-row chunks: within a logit's bf16 ulp
    for a, b, exact in zip(ours[1:], ref[1:], fp32[1:]):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == torch.float32
            assert (a - exact).abs().max() <= 1.5 * (b - exact).abs().max()
            assert (a - b).abs().max() <= 2 ** -7 * b.abs().max()


def test_under_bf16_autocast_it_keeps_no_logits_for_the_backward():
    head, hidden, targets = case(True, n=40, vocab=500)
    saved = []
    h = hidden.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16), \
            torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        linear_cross_entropy(h, head, targets, chunk_rows=16)
    assert saved == [(40, 32), (500, 32)]  # ∂loss/∂h and ∂loss/∂W only: no (N, V) tensor


def test_keeps_no_logits_for_the_backward():
    head, hidden, targets = case(False, n=40, vocab=500)
    saved = []
    h = hidden.clone().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        linear_cross_entropy(h, head, targets, chunk_rows=16)
    assert saved == [(40, 32)]  # ∂loss/∂h only: no (N, V) tensor


class LiveChunks(TorchDispatchMode):
    """Counts the (C, V) tensors the ops make that are alive at once (weakly referenced)."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.live, self.most = shape, 0, 0

    def _gone(self):
        self.live -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and tuple(t.shape) == self.shape and not any(t is a for a in args):
                self.live += 1  # a new tensor of a chunk's logits' shape (not an in-place op's own argument)
                self.most = max(self.most, self.live)
                weakref.finalize(t, self._gone)
        return out


@pytest.mark.parametrize("trained", [False, True])
def test_one_chunk_of_logits_lives_at_a_time(trained):
    # the previous chunk's (C, V) tensor is freed before the next chunk's logits are formed: the step's
    # peak memory holds one, not two (25 MB each for SmolLM2's 49,152 tokens at 128 rows)
    head, hidden, targets = case(trained, n=64, vocab=500)
    h = hidden.clone().requires_grad_(True)
    with LiveChunks((16, 500)) as mode:
        linear_cross_entropy(h, head, targets, chunk_rows=16).backward()
    assert mode.most == 1


def test_without_gradients_it_is_the_plain_loss():
    head, hidden, targets = case(False)
    with torch.no_grad():
        assert torch.equal(linear_cross_entropy(hidden, head, targets), F.cross_entropy(head(hidden), targets))


@pytest.mark.parametrize("trained", [False, True])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_smoothing_without_the_pad_class_equals_the_translation_loss(trained, epsilon):
    # pad_id: ε spread over the V − 1 classes other than pad (nn/cross_entropy.py), as the
    # translation step trains; loss (1e-6) and gradients (5e-6: fp32 summation order)
    head, hidden, targets = case(trained)
    targets = targets.clamp(min=1)  # the rows that carry a loss: none is padding
    ours = run(lambda h: linear_cross_entropy(h, head, targets, epsilon, chunk_rows=8, pad_id=0), head, hidden,
               targets)
    ref = run(lambda h: label_smoothed_cross_entropy(head(h), targets, epsilon, pad_id=0), head, hidden, targets)
    assert (ours[0] - ref[0]).abs() <= 1e-6 * ref[0].abs()
    for a, b in zip(ours[1:], ref[1:]):
        assert (a is None) == (b is None)
        if a is not None:
            assert (a - b).abs().max() <= 5e-6 * b.abs().max()
    with torch.no_grad():  # the composition itself where no gradient is taken (evaluation)
        assert torch.equal(linear_cross_entropy(hidden, head, targets, epsilon, pad_id=0),
                           label_smoothed_cross_entropy(head(hidden), targets, epsilon, pad_id=0))


def test_a_head_tied_to_the_embedding_gets_both_gradients():
    # the translation model's output projection shares the embedding's weight (§3.4): the weight's
    # gradient is the embedding's part plus the head's, as with the composition
    torch.manual_seed(0)
    embed = nn.Embedding(50, 16)
    head = nn.Linear(16, 50, bias=False)
    head.weight = embed.weight
    tokens, targets = torch.randint(1, 50, (30,)), torch.randint(1, 50, (30,))
    grads = []
    for loss_fn in (lambda h: linear_cross_entropy(h, head, targets, 0.1, chunk_rows=7, pad_id=0),
                    lambda h: label_smoothed_cross_entropy(head(h), targets, 0.1, pad_id=0)):
        embed.zero_grad(set_to_none=True)
        loss_fn(torch.tanh(embed(tokens))).backward()
        grads.append(embed.weight.grad.clone())
    assert (grads[0] - grads[1]).abs().max() <= 5e-6 * grads[1].abs().max()


def test_a_chunk_holds_about_chunk_bytes_of_logits():
    assert chunk_rows_for(49_152) == 128  # SmolLM2: the 128 rows measured (module doc)
    assert chunk_rows_for(8_000) == 786   # Multi30k's joint BPE
    assert chunk_rows_for(10**9) == 1


def test_fp16_autocast_takes_the_composition():
    head, hidden, targets = case(True)
    h = hidden.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.float16):
        assert not _fused(head, h)  # fp16's range: (p − y) / N would round into its subnormals
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _fused(head, h)
