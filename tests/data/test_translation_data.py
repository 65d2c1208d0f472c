import pytest
import torch

from attnlab.data.datasets import DatasetNotFoundError, find_dataset, search_path
from attnlab.data.translation import ParallelCorpus, collate, read_lines, read_parallel, token_batches


def corpus(n=200):
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(1, 30, (n, 2), generator=g).tolist()
    return ParallelCorpus([[5] * a for a, _ in lens], [[6] * b for _, b in lens])


def test_token_batches_cover_every_pair_once_within_budget():
    c = corpus()
    batches = token_batches(c, 120, seed=3)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(c)))
    for b in batches:
        width = max(max(len(c.src[i]), len(c.tgt[i]) + 1) for i in b)
        assert len(b) * width <= 120 or len(b) == 1
    assert token_batches(c, 120, seed=3) == batches  # deterministic
    assert token_batches(c, 120, seed=4) != batches  # another epoch, another order


def test_length_bucketing_keeps_padding_low():
    c = corpus(1000)
    batches = token_batches(c, 400, seed=0)
    real = sum(len(t) + 1 for t in c.tgt)
    padded = sum(len(b) * max(len(c.tgt[i]) + 1 for i in b) for b in batches)
    assert padded < 1.15 * real


def test_collate_is_teacher_forcing():
    c = ParallelCorpus([[7, 8], [9]], [[10, 11, 12], [13]])
    src, tgt_in, labels = collate(c, [0, 1], pad_id=0, bos_id=1, eos_id=2)
    assert src.tolist() == [[7, 8], [9, 0]]
    assert tgt_in.tolist() == [[1, 10, 11, 12], [1, 13, 0, 0]]
    assert labels.tolist() == [[10, 11, 12, 2], [13, 2, 0, 0]]


def test_read_parallel_skips_empty_lines(tmp_path, monkeypatch):
    folder = tmp_path / "multi30k"
    folder.mkdir()
    (folder / "val.en").write_text("A dog.\n\nA cat.\n  \n", encoding="utf-8")
    (folder / "val.de").write_text("Ein Hund.\nLeer.\nEine Katze.\nx\n", encoding="utf-8")
    monkeypatch.setenv("ATTNLAB_DATA", str(tmp_path))
    assert read_parallel("multi30k", "val", "en", "de") == (["A dog.", "A cat."], ["Ein Hund.", "Eine Katze."])


def test_missing_dataset_names_places_and_source(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_DATA", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetNotFoundError) as e:
        find_dataset("multi30k", ["nosuch.en"], download=False)
    msg = str(e.value)
    assert str(tmp_path / "multi30k") in msg and "github.com/multi30k/dataset" in msg
    assert search_path()[0] == tmp_path


def test_invalid_utf8_names_file_and_offset(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"ok\n\xff\xfe")
    with pytest.raises(ValueError, match="byte offset 3"):
        read_lines(p)
