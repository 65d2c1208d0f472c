import pytest
import torch

from attnlab.data.rampup import rampup_batches, rampup_cap
from attnlab.data.translation import ParallelCorpus, token_batches
from attnlab.errors import UserError
from attnlab.tasks.translation import TranslationDataConfig, TranslationObjective


def corpus(n=400):
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(1, 30, (n, 2), generator=g).tolist()
    return ParallelCorpus([[5] * a for a, _ in lens], [[6] * b for _, b in lens])


def padded(c, batch):
    return len(batch) * max(c.row_tokens()[i] for i in batch)


def test_cap_is_linear_from_start_to_full():
    assert rampup_cap(0, 1000, 3000, 200) == 1000
    assert rampup_cap(100, 1000, 3000, 200) == 2000
    assert rampup_cap(199, 1000, 3000, 200) == pytest.approx(2990)
    assert rampup_cap(200, 1000, 3000, 200) == rampup_cap(10_000, 1000, 3000, 200) == 3000
    with pytest.raises(ValueError, match="start_tokens"):
        rampup_cap(0, 4000, 3000, 200)


def test_ramp_splits_early_batches_under_the_cap_and_keeps_every_example_in_order():
    c = corpus()
    full = token_batches(c, 400, seed=0)
    ramped = rampup_batches(full, c.row_tokens(), 100, 400, rampup=30)
    assert [i for b in ramped for i in b] == [i for b in full for i in b]  # nothing dropped, repeated or moved
    assert len(ramped) > len(full)
    for j, b in enumerate(ramped[:30]):
        assert padded(c, b) <= rampup_cap(j, 100, 400, 30) * 1.5 or len(b) == 1  # near-equal row pieces
    first_whole = next(j for j in range(len(ramped)) if j >= 30 and ramped[j] in full)
    assert ramped[first_whole:] == full[full.index(ramped[first_whole]):]  # after the ramp: the epoch's own batches
    assert padded(c, ramped[0]) < padded(c, full[0]) or len(full[0]) == 1


def test_no_ramp_is_the_identity():
    c = corpus()
    full = token_batches(c, 400, seed=0)
    assert rampup_batches(full, c.row_tokens(), 0, 400, rampup=0) == full
    with pytest.raises(ValueError, match="rampup"):
        rampup_batches(full, c.row_tokens(), 100, 400, rampup=-1)


def objective(**data):
    c = corpus()
    cfg = TranslationDataConfig(batch_tokens=400, **data)
    return c, TranslationObjective(None, c, c, [], cfg, seed=0, pad_id=0, bos_id=1, eos_id=2)


def test_objective_ramps_the_first_epoch_only_and_the_same_way_each_call():
    c, ramped = objective(batch_tokens_start=100, batch_rampup=20)
    _, plain = objective()
    assert ramped.batches(0) == ramped.batches(0)  # a resumed run finds its position in the same list
    assert len(ramped.batches(0)) > len(plain.batches(0))
    assert ramped.batches(1) == plain.batches(1)
    assert sorted(i for b in ramped.batches(0) for i in b) == list(range(len(c)))


@pytest.mark.parametrize("data, field", [
    (dict(batch_tokens_start=500, batch_rampup=10), "batch_tokens_start"),
    (dict(batch_tokens_start=0, batch_rampup=10), "batch_tokens_start"),
    (dict(batch_tokens_start=100), "batch_tokens_start"),
    (dict(batch_rampup=-1), "batch_rampup"),
])
def test_bad_ramp_names_the_field(data, field):
    with pytest.raises(UserError, match=field):
        TranslationDataConfig(batch_tokens=400, **data)
