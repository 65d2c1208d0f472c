"""Regression tests for the bad-input findings of a break-it pass (each once gave a traceback, a
misleading message or silently did the wrong thing)."""
import io
import sys

import pytest
import torch

from attnlab.cli import main
from tests.conftest import TINY_LM


def test_an_empty_image_is_refused_with_its_size():
    from attnlab.models.vit import ViTConfig
    from attnlab.models.vit import VisionTransformer

    vit = VisionTransformer(ViTConfig(image_size=28, patch_size=7, in_channels=1, n_classes=10, d_model=16,
                                      n_layers=1, n_heads=2))
    with pytest.raises(ValueError, match="image size 0×0 is empty"):
        vit(torch.zeros(1, 1, 0, 0))


def test_a_classifier_needs_two_labels():
    from attnlab.models.bert import BertConfig

    with pytest.raises(ValueError, match="n_labels must be >= 2"):
        BertConfig(n_labels=1)


def test_a_damaged_checkpoint_names_the_file(tiny_shakespeare, tmp_path, capsys):
    out = tmp_path / "run"
    sets = [x for s in TINY_LM for x in ("--set", s)]
    assert main(["train", "--recipe", "shakespeare-char", "--steps", "10", "--out", str(out), *sets]) == 0
    optimizer = out / "checkpoint" / "optimizer.safetensors"
    optimizer.write_bytes(optimizer.read_bytes()[:20])
    capsys.readouterr()
    assert main(["train", "--recipe", "shakespeare-char", "--steps", "20", "--out", str(out), "--resume"]) == 2
    assert "optimizer.safetensors is not a readable safetensors file" in capsys.readouterr().err
    (out / "checkpoint" / "state.json").write_text("garbage")
    assert main(["train", "--recipe", "shakespeare-char", "--steps", "20", "--out", str(out), "--resume"]) == 2
    assert "state.json" in capsys.readouterr().err


def test_resuming_under_another_recipe_is_refused(tiny_shakespeare, tmp_path, capsys):
    out = tmp_path / "run"
    sets = [x for s in TINY_LM for x in ("--set", s)]
    assert main(["train", "--recipe", "shakespeare-char", "--steps", "10", "--out", str(out), *sets]) == 0
    capsys.readouterr()
    assert main(["train", "--recipe", "shakespeare-char-llama", "--steps", "20", "--out", str(out), "--resume"]) == 2
    assert "trained with recipe 'shakespeare-char'" in capsys.readouterr().err


def test_a_missing_init_run_says_how_to_make_it(capsys, tmp_path):
    assert main(["train", "--recipe", "sst2", "--out", str(tmp_path / "x"), "--set", "init=/no/such/run"]) == 2
    assert "train it first" in capsys.readouterr().err


def test_an_empty_stdin_line_is_named(monkeypatch):
    from attnlab.cli.args import texts as _texts

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a\n\nb\n")))
    with pytest.raises(ValueError, match="stdin line 2 is empty"):
        _texts([])
    with pytest.raises(ValueError, match="argument 2 is empty"):
        _texts(["ok", " "])


def test_a_seed_out_of_range_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", "x", "--prompt", "hi", "--seed", str(2 ** 70)])
    assert e.value.code == 2 and "2**63" in capsys.readouterr().err
