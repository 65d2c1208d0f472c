import pytest
import torch

from attnlab.data.translation import ParallelCorpus, collate
from attnlab.generate import beam_search, greedy_decode, length_penalty
from attnlab.models.seq2seq import Seq2SeqTransformer
from attnlab.tasks.translation import teacher_forcing_loss
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def overfit_model():
    """A tiny model trained until it reproduces a tiny parallel set (targets of varied lengths)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    src = [torch.randint(3, 40, (int(n),), generator=g).tolist() for n in (3, 5, 4, 6, 2, 5)]
    tgt = [list(reversed(s))[: max(1, len(s) - i % 3)] for i, s in enumerate(src)]
    corpus = ParallelCorpus(src, tgt)
    m = Seq2SeqTransformer(tiny_config(d_model=64, d_ff=128))
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    batch = collate(corpus, list(range(len(src))), 0, 1, 2)
    for _ in range(300):
        loss, _ = teacher_forcing_loss(m, *batch, epsilon=0.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m.eval(), corpus, batch[0]


def test_greedy_reproduces_overfit_set(overfit_model):
    m, corpus, src = overfit_model
    assert greedy_decode(m, src) == corpus.tgt


@pytest.mark.parametrize("k", [1, 2, 4])
def test_beam_reproduces_overfit_set(overfit_model, k):
    m, corpus, src = overfit_model
    assert beam_search(m, src, beam_size=k, alpha=0.6) == corpus.tgt


def test_beam_of_one_equals_greedy_on_random_model():
    m = Seq2SeqTransformer(tiny_config()).eval()
    src = torch.randint(3, 40, (3, 5))
    assert beam_search(m, src, 1, alpha=0.0, max_new_tokens=8) == greedy_decode(m, src, max_new_tokens=8)


def test_beam_finds_no_worse_sequence_than_greedy():
    torch.manual_seed(3)
    m = Seq2SeqTransformer(tiny_config()).eval()
    src = torch.randint(3, 40, (4, 5))

    def logprob(i, ids):
        tgt_in = torch.tensor([[1] + ids])
        labels = torch.tensor([ids + [2]])
        logp = m(src[i:i + 1], tgt_in).log_softmax(-1)
        return logp.gather(-1, labels[..., None]).sum().item()

    greedy = greedy_decode(m, src, max_new_tokens=6)
    beam = beam_search(m, src, 4, alpha=0.0, max_new_tokens=6)
    for i in range(4):
        if len(greedy[i]) < 6 and len(beam[i]) < 6:  # both finished with <eos>
            assert logprob(i, beam[i]) >= logprob(i, greedy[i]) - 1e-4


def test_length_penalty_known_value():
    assert length_penalty(1, 0.6) == 1.0
    assert abs(length_penalty(7, 0.6) - 2.0 ** 0.6) < 1e-12
