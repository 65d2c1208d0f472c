import pytest
import torch

from attnlab.models.seq2seq import Seq2SeqTransformer
from attnlab.tasks.translation import teacher_forcing_loss
from tests.conftest import tiny_config


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_padding_invariance(norm):
    m = Seq2SeqTransformer(tiny_config(norm_position=norm)).eval()
    src = torch.tensor([[5, 6, 7, 8]])
    padded = torch.tensor([[5, 6, 7, 8, 0, 0, 0]])
    tgt = torch.tensor([[1, 9, 10, 11]])
    torch.testing.assert_close(m(src, tgt), m(padded, tgt), atol=1e-5, rtol=1e-5)


def test_encoder_outputs_at_padded_positions_change_nothing():
    m = Seq2SeqTransformer(tiny_config()).eval()
    src = torch.tensor([[5, 6, 7, 0, 0]])
    tgt = torch.tensor([[1, 9, 10]])
    memory, mask = m.encode(src)
    noisy = memory.clone()
    noisy[:, 3:] = torch.randn(1, 2, memory.size(-1)) * 100
    torch.testing.assert_close(m.decode(tgt, memory, mask), m.decode(tgt, noisy, mask))


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_causality(norm):
    m = Seq2SeqTransformer(tiny_config(norm_position=norm)).eval()
    src = torch.tensor([[5, 6, 7, 8]])
    tgt = torch.tensor([[1, 9, 10, 11, 12, 13]])
    changed = tgt.clone()
    changed[0, 3] = 20
    a, b = m(src, tgt), m(src, changed)
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert not torch.allclose(a[:, 3:], b[:, 3:])


def test_cached_decoding_equals_uncached():
    m = Seq2SeqTransformer(tiny_config()).eval()
    src = torch.tensor([[5, 6, 7, 8, 0], [9, 10, 11, 12, 13]])
    tgt = torch.tensor([[1, 9, 10, 11, 12], [1, 14, 15, 16, 17]])
    memory, mask = m.encode(src)
    full = m.output_logits(m.decode(tgt, memory, mask))
    state = m.start_decoding(memory, mask, max_len=8)
    steps = [m.output_logits(m.decode(tgt[:, i:i + 1], None, mask, state)) for i in range(tgt.size(1))]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_fully_padded_source_row_gives_finite_loss_and_gradients():
    m = Seq2SeqTransformer(tiny_config())
    src = torch.tensor([[5, 6, 7], [0, 0, 0]])
    tgt_in = torch.tensor([[1, 9, 10], [1, 11, 0]])
    labels = torch.tensor([[9, 10, 2], [11, 2, 0]])
    loss, n = teacher_forcing_loss(m, src, tgt_in, labels, 0.1)
    loss.backward()
    assert n == 5 and torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_both_norm_positions_train(norm):
    m = Seq2SeqTransformer(tiny_config(norm_position=norm))
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    src = torch.randint(3, 40, (8, 6))
    tgt = torch.randint(3, 40, (8, 6))
    tgt_in = torch.cat([torch.ones(8, 1, dtype=torch.long), tgt], 1)
    labels = torch.cat([tgt, torch.full((8, 1), 2)], 1)
    losses = []
    for _ in range(60):
        loss, _ = teacher_forcing_loss(m, src, tgt_in, labels, 0.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0]


def test_tied_embeddings_share_one_matrix():
    m = Seq2SeqTransformer(tiny_config())
    assert m.lm_head.weight is m.src_embed.weight is m.tgt_embed.weight
    untied = Seq2SeqTransformer(tiny_config(tie_embeddings=False))
    assert untied.lm_head.weight is not untied.tgt_embed.weight


def test_too_long_input_is_rejected():
    m = Seq2SeqTransformer(tiny_config(max_seq_len=8))
    with pytest.raises(ValueError, match="max_seq_len=8"):
        m.encode(torch.ones(1, 9, dtype=torch.long))
