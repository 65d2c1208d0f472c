"""The training loop's gradient accumulation: the loss of a window is Σ token losses / Σ tokens."""
import pytest
import torch

from attnlab.data.translation import pad_batch
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.tasks.translation import teacher_forcing_loss
from attnlab.train.config import TrainConfig
from attnlab.train.loop import Trainer


class FixedBatches:
    """An objective over given (src, tgt_in, labels) batches: the teacher-forcing loss, no smoothing."""

    best_metric = "val_loss"

    def loss(self, model, batch):
        return teacher_forcing_loss(model, *batch, epsilon=0.0)


def _batch(pairs, pad=0, bos=1, eos=2):
    """(src, tgt_in, labels) of (source ids, target ids) pairs, right-padded."""
    return (pad_batch([s for s, _ in pairs], pad), pad_batch([[bos] + t for _, t in pairs], pad),
            pad_batch([t + [eos] for _, t in pairs], pad))


def _trainer(tmp_path, name, accum):
    torch.manual_seed(0)
    model = Seq2SeqTransformer(Seq2SeqConfig(vocab_size=32, d_model=16, n_heads=2, n_encoder_layers=1,
                                             n_decoder_layers=1, d_ff=32, dropout=0.0, max_seq_len=32))
    cfg = TrainConfig(lr_schedule="constant", lr=1e-3, warmup_steps=1, clip_grad_norm=0.0, grad_accum_steps=accum)
    return Trainer(model, FixedBatches(), cfg, tmp_path / name, 16)


def test_accumulated_gradient_weighs_micro_batches_by_their_tokens(tmp_path):
    g = torch.Generator().manual_seed(1)
    ids = lambda n: torch.randint(3, 32, (n,), generator=g).tolist()  # noqa: E731
    short = [(ids(4), ids(2))]                          # 3 target tokens (2 + <eos>)
    long = [(ids(6), ids(7)), (ids(5), ids(7))]         # 16 target tokens
    whole, accum = _trainer(tmp_path, "whole", 1), _trainer(tmp_path, "accum", 2)
    loss_whole, n_whole = whole._train_step([_batch(short + long)])
    loss_accum, n_accum = accum._train_step([_batch(short), _batch(long)])
    assert n_whole == n_accum == 19
    assert loss_accum == pytest.approx(loss_whole, abs=1e-6)
    model = _trainer(tmp_path, "reference", 1).model  # the same initial weights, before any step
    per_batch = [teacher_forcing_loss(model, *_batch(b), 0.0)[0].item() for b in (short, long)]
    assert loss_accum == pytest.approx((3 * per_batch[0] + 16 * per_batch[1]) / 19, abs=1e-5)
    assert abs(loss_accum - sum(per_batch) / 2) > 0.01  # the mean of the two means, the old logged loss
    for (name, a), b in zip(whole.model.named_parameters(), accum.model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=1e-5, msg=name)
    flat = lambda trainer: torch.cat([p.grad.flatten() for p in trainer.model.parameters()])  # noqa: E731
    assert ((flat(accum) - flat(whole)).norm() / flat(whole).norm()).item() < 1e-5  # the mean of means: 0.73
