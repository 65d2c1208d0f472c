import torch

from attnlab.data.mlm import IGNORE, mask_tokens

PAD, CLS, SEP, MASK, V = 0, 2, 3, 4, 1000


def big_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (400, 64), generator=g)
    ids[:, 0], ids[:, -1] = CLS, SEP
    ids[200:, 40:] = PAD  # half the rows padded
    eligible = (ids != PAD) & (ids != CLS) & (ids != SEP)
    return ids, eligible


def test_masking_statistics_on_a_seeded_large_batch():
    ids, eligible = big_batch()
    inputs, labels = mask_tokens(ids, eligible, MASK, V, 0.15, torch.Generator().manual_seed(1))
    chosen = labels != IGNORE
    assert abs(chosen.sum().item() / eligible.sum().item() - 0.15) < 0.01
    masked = (inputs == MASK) & chosen
    kept = (inputs == ids) & chosen
    replaced = chosen & ~masked & ~kept
    n = chosen.sum().item()
    assert abs(masked.sum().item() / n - 0.8) < 0.02
    assert abs(replaced.sum().item() / n - 0.1) < 0.02
    assert abs(kept.sum().item() / n - 0.1) < 0.02  # (a random draw equal to the original counts as kept)
    assert torch.equal(labels[chosen], ids[chosen])
    assert torch.equal(inputs[~chosen], ids[~chosen])  # nothing else changes


def test_special_and_padding_tokens_are_never_chosen():
    ids, eligible = big_batch(2)
    for seed in range(5):
        inputs, labels = mask_tokens(ids, eligible, MASK, V, 0.5, torch.Generator().manual_seed(seed))
        assert (labels[~eligible] == IGNORE).all()
        assert torch.equal(inputs[~eligible], ids[~eligible])


def test_random_replacements_come_from_the_given_ids_and_seed_reproduces():
    ids, eligible = big_batch(3)
    ordinary = torch.arange(5, V)
    a = mask_tokens(ids, eligible, MASK, V, 0.15, torch.Generator().manual_seed(7), ordinary)
    b = mask_tokens(ids, eligible, MASK, V, 0.15, torch.Generator().manual_seed(7), ordinary)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    chosen = a[1] != IGNORE
    assert (a[0][chosen & (a[0] != MASK)] >= 5).all()
