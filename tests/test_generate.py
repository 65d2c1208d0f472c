import math

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


def test_beam_search_stops_decoding_finished_sentences(overfit_model, monkeypatch):
    """A finished sentence leaves the batch (its rows are no longer decoded), and the others' results
    are those each reaches alone (before: every row ran until the last sentence finished)."""
    m, corpus, src = overfit_model
    alone = [beam_search(m, src[i:i + 1], 4, alpha=0.6)[0] for i in range(src.size(0))]
    rows, decode = [], m.decode
    monkeypatch.setattr(m, "decode", lambda tokens, *a, **kw: rows.append(tokens.size(0)) or decode(tokens, *a, **kw))
    assert beam_search(m, src, 4, alpha=0.6) == alone == corpus.tgt
    assert rows[0] == 4 * src.size(0) and rows[-1] < rows[0] and rows == sorted(rows, reverse=True)
    assert set(rows) <= {4 * n for n in range(1, src.size(0) + 1)}


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


# ----------------------------------------------------------------------------- beam search = brute force (issue 12, 5)
PAD, BOS, EOS, A, B = 0, 1, 2, 3, 4
NEG = float("-inf")


def issue_table(prefix: tuple) -> list[float]:
    """Issue 12's toy model, by position: <eos> .5 / a .25 / b .25, then <eos> .6 / a .4, then a ≈ 1."""
    probs = [[0, 0, 0.5, 0.25, 0.25], [0, 0, 0.6, 0.4, 0], [0, 0, 1e-6, 1 - 1e-6, 0]][min(len(prefix), 2)]
    return [math.log(p) if p > 0 else NEG for p in probs]


def random_chain(seed: int):
    """Prefix-dependent next-token log-probabilities over <eos> and a single token a (a fixed random
    draw per prefix): the hypotheses are a^j <eos> (j < max length) and a^max."""
    def table(prefix: tuple) -> list[float]:
        logits = torch.randn(2, generator=torch.Generator().manual_seed(1000 * seed + len(prefix))) * 4
        return [NEG, NEG, *logits.double().log_softmax(-1).tolist(), NEG]  # pad, bos, <eos>, a, b
    return table


class ToyDecoder:
    """The decoding interface beam_search uses (encode, start_decoding, decode, output_logits), with
    next-token log-probabilities from table(prefix) instead of a network."""

    def __init__(self, table):
        self.table = table
        self.cfg = tiny_config(vocab_size=5, max_seq_len=64)  # pad 0, bos 1, eos 2

    def encode(self, src):
        return torch.zeros(src.size(0), 1), torch.ones(src.size(0), 1, dtype=torch.bool)

    def start_decoding(self, memory, src_mask, max_len):
        return ToyState(torch.zeros(memory.size(0), 0, dtype=torch.long))

    def decode(self, tokens, memory, src_mask, state):
        if tokens[0, 0] != BOS:
            state.prefixes = torch.cat([state.prefixes, tokens], dim=1)
        rows = [self.table(tuple(p)) for p in state.prefixes.tolist()]
        return torch.tensor(rows, dtype=torch.float32)[:, None]  # (B, 1, V): the "hidden state" is the answer

    def output_logits(self, h):
        return h


class ToyState:
    def __init__(self, prefixes):
        self.prefixes = prefixes  # (B, t) tokens so far

    def reorder(self, index, same_source=False):
        self.prefixes = self.prefixes.index_select(0, index)


def brute_force(table, max_len: int, alpha: float) -> list[tuple[float, list[int]]]:
    """Every hypothesis with a finite probability and its score log P / lp(|Y|), best first: ended by
    <eos> (|Y| counts it) or cut at max_len tokens (|Y| = max_len), beam_search's scoring rule."""
    out = []

    def visit(prefix, logp):
        if len(prefix) == max_len:
            out.append((logp / length_penalty(max_len, alpha), prefix))
            return
        for t, lp in enumerate(table(tuple(prefix))):
            if lp == NEG:
                continue
            if t == EOS:
                out.append(((logp + lp) / length_penalty(len(prefix) + 1, alpha), prefix))
            else:
                visit(prefix + [t], logp + lp)

    visit([], 0.0)
    return sorted(out, key=lambda x: -x[0])


def score_of(result, candidates):
    return next(s for s, y in candidates if y == result)


@pytest.mark.parametrize("alpha,max_len", [(2.0, 8), (1.0, 20)])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_beam_search_under_a_length_penalty_equals_brute_force(alpha, max_len, k):
    """Issue 12 item 5: the bound at the current length stopped at the empty hypothesis (score
    −0.693) while a⁸ scores −0.4905 at α 2, max length 8 (the same at α 1, max length 20)."""
    candidates = brute_force(issue_table, max_len, alpha)
    best = candidates[0][0]
    src = torch.ones(2, 3, dtype=torch.long)
    results = beam_search(ToyDecoder(issue_table), src, k, alpha, max_new_tokens=max_len)
    for result in results:
        assert len(result) == max_len and result[1:] == [A] * (max_len - 1)  # a⁸ (or b a⁷, its tie)
        assert score_of(result, candidates) == pytest.approx(best, abs=1e-5)
    if alpha == 2.0:
        assert best == pytest.approx(-0.4905, abs=1e-4)
    # the old stop, kept as an option, ends at the empty hypothesis
    old = beam_search(ToyDecoder(issue_table), src, 2, alpha, max_new_tokens=max_len, early_stopping="heuristic")
    assert old == [[], []] and score_of([], candidates) == pytest.approx(math.log(0.5))


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_beam_that_prunes_nothing_equals_brute_force(seed, alpha):
    """On a chain (one token besides <eos>) a beam of 2 keeps every candidate, so only the stopping
    test can lose the best hypothesis: with the exact bound the result is brute force's."""
    table = random_chain(seed)
    candidates = brute_force(table, 10, alpha)
    result = beam_search(ToyDecoder(table), torch.ones(1, 3, dtype=torch.long), 2, alpha, max_new_tokens=10)[0]
    assert score_of(result, candidates) == pytest.approx(candidates[0][0], abs=1e-5)


def test_beam_search_bad_early_stopping_raises():
    with pytest.raises(ValueError, match="early_stopping"):
        beam_search(ToyDecoder(issue_table), torch.ones(1, 3, dtype=torch.long), 2, early_stopping="never")
