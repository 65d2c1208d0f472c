"""The command line on tiny data: train, evaluate (JSON), translate; bad input exits 2 in one line."""
import json
import subprocess
import sys

import pytest

from attnlab.cli import main
from tests.train.test_resume import TINY


def run_cli(*args, stdin=""):
    return subprocess.run([sys.executable, "-m", "attnlab", *args], input=stdin, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def trained(tiny_multi30k, tmp_path):
    out = tmp_path / "run"
    sets = [x for s in TINY for x in ("--set", s)]
    assert main(["train", "--recipe", "multi30k-en-de", "--steps", "4", "--out", str(out), *sets]) == 0
    return out


def test_train_evaluate_translate(trained, capsys):
    capsys.readouterr()
    assert main(["evaluate", "--model", str(trained), "--split", "test", "--limit", "5", "--beam", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["split"] == "test_2016_flickr" and result["n"] == 5 and 0 <= result["bleu"] <= 100
    assert main(["translate", "--model", str(trained), "--beam", "1", "A dog.", "Two cats sit."]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_translate_reads_stdin_and_skips_empty_lines(trained):
    r = run_cli("translate", "--model", str(trained), "--beam", "1", stdin="A dog.\n\nA cat.\n")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2


def test_existing_run_is_not_overwritten(trained, capsys):
    assert main(["train", "--recipe", "multi30k-en-de", "--steps", "1", "--out", str(trained)]) == 2
    assert "--resume" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["train", "--recipe", "nope"], "known recipes: multi30k-en-de"),
    (["train", "--recipe", "multi30k-en-de", "--set", "d_modle=3"], "unknown setting 'd_modle'"),
    (["train", "--recipe", "multi30k-en-de", "--set", "norm_position=middle"], "norm_position must be one of"),
    (["train", "--recipe", "multi30k-en-de", "--set", "d_model=abc"], "d_model must be int"),
    (["train", "--recipe", "multi30k-en-de", "--set", "n_heads=3"], "d_model must be divisible by n_heads=3"),
    (["evaluate", "--model", "/nonexistent/run"], "config.json is missing"),
])
def test_bad_input_exits_2_with_one_line(args, message, tmp_path):
    r = run_cli(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_missing_data_names_places_and_source(tmp_path, monkeypatch, capsys):
    import attnlab.data.datasets as datasets

    def offline(remote, dest):
        raise OSError("network is unreachable")

    monkeypatch.setattr(datasets, "_download", offline)
    monkeypatch.setattr(datasets, "search_path", lambda: [tmp_path / "empty", tmp_path / "cache"])
    assert main(["train", "--recipe", "multi30k-en-de", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "empty" / "multi30k") in err and "github.com/multi30k/dataset" in err
    assert "network is unreachable" in err and len(err.strip().splitlines()) == 1
