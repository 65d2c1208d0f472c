"""The command line on tiny data: train, evaluate (JSON), translate; bad input exits 2 in one line."""
import json
import subprocess
import sys

import pytest

from attnlab.cli import main
from tests.conftest import TINY


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


def test_evaluate_takes_the_length_penalty_of_the_search(trained, capsys):
    capsys.readouterr()
    assert main(["evaluate", "--model", str(trained), "--limit", "5", "--beam", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["length_penalty"] == 1.0  # the run's own (the recipe's)
    assert main(["evaluate", "--model", str(trained), "--limit", "5", "--beam", "2", "--length-penalty", "0.6"]) == 0
    assert json.loads(capsys.readouterr().out)["length_penalty"] == 0.6
    from attnlab.errors import UserError
    from attnlab.tasks.registry import evaluate_run
    with pytest.raises(UserError, match="length_penalty must be >= 0, got nan"):
        evaluate_run(trained, limit=1, length_penalty=float("nan"))


def test_translate_reads_stdin_and_skips_empty_lines_keeping_alignment(trained):
    r = run_cli("translate", "--model", str(trained), "--beam", "1", stdin="A dog.\n\nA cat.\n")
    assert r.returncode == 0, r.stderr
    out = r.stdout.split("\n")
    assert len(out) == 4 and out[1] == "" and out[3] == ""  # three lines, the empty one stays empty


def test_non_utf8_stdin_names_the_line(trained):
    r = subprocess.run([sys.executable, "-m", "attnlab", "translate", "--model", str(trained)],
                       input=b"A dog.\n\xff\xfe cat\n", capture_output=True, timeout=300)
    assert r.returncode == 2 and b"stdin line 2: not valid UTF-8 at byte offset" in r.stderr


def test_resuming_a_finished_run_changes_nothing(trained, capsys):
    before = (trained / "metrics.jsonl").read_text()
    assert main(["train", "--recipe", "multi30k-en-de", "--steps", "4", "--out", str(trained), "--resume"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 4
    assert (trained / "metrics.jsonl").read_text() == before


def test_damaged_run_directory_gives_one_line(trained, capsys):
    (trained / "config.json").write_text("[]")
    assert main(["evaluate", "--model", str(trained)]) == 2
    assert "must hold a JSON object" in capsys.readouterr().err
    (trained / "config.json").write_text("{")
    assert main(["translate", "--model", str(trained), "x"]) == 2
    assert "config.json is not valid JSON" in capsys.readouterr().err


def test_weights_that_do_not_match_the_config_give_one_line(trained, capsys):
    cfg = json.loads((trained / "config.json").read_text())
    cfg["model"]["d_model"] = 64
    (trained / "config.json").write_text(json.dumps(cfg))
    assert main(["translate", "--model", str(trained), "x"]) == 2
    assert "does not match the model's config" in capsys.readouterr().err
    (trained / "model.safetensors").write_bytes(b"garbage")
    assert main(["translate", "--model", str(trained), "x"]) == 2


def test_invalid_setting_leaves_no_run_behind(tiny_multi30k, tmp_path, capsys):
    out = tmp_path / "bad"
    assert main(["train", "--recipe", "multi30k-en-de", "--out", str(out), "--set", "beta1=1.5"]) == 2
    assert "beta1 must be in [0, 1)" in capsys.readouterr().err
    assert not out.exists()


def test_unknown_split_lists_the_known_ones(trained, capsys):
    assert main(["evaluate", "--model", str(trained), "--split", "nosuch"]) == 2
    assert "unknown split 'nosuch'; known: train, val, test" in capsys.readouterr().err


def test_existing_run_is_not_overwritten(trained, capsys):
    assert main(["train", "--recipe", "multi30k-en-de", "--steps", "1", "--out", str(trained)]) == 2
    assert "--resume" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["train", "--recipe", "nope"], "known recipes: bert-mlm, digits-vit, mnist-vit, multi30k-en-de"),
    (["train", "--recipe", "multi30k-en-de", "--set", "d_modle=3"], "unknown setting 'd_modle'"),
    (["train", "--recipe", "multi30k-en-de", "--set", "norm_position=middle"], "norm_position must be one of"),
    (["train", "--recipe", "multi30k-en-de", "--set", "d_model=abc"], "d_model must be int"),
    (["train", "--recipe", "multi30k-en-de", "--set", "n_heads=3"], "d_model must be divisible by n_heads=3"),
    (["evaluate", "--model", "/nonexistent/run"], "is not a directory"),
    (["evaluate", "--model", ".", "--beam", "0"], "must be in 1..64"),
    (["evaluate", "--model", ".", "--length-penalty", "-1"], "must be a finite number >= 0"),
    (["train", "--recipe", "multi30k-en-de", "--set", "eps=0"], "eps must be > 0"),
    (["train"], "the following arguments are required: --recipe"),
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
