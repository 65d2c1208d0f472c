"""`attnlab viz` through attnlab.cli.main: one JSON line out; bad input exits 2 with one line."""
import json

import pytest

from attnlab.cli import main


def _run(capsys, *argv):
    code = main(["viz", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_unknown_kind_lists_the_kinds(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["viz", "nope"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    for kind in ("attention", "context", "positions", "masks", "teacher-forcing", "schedule", "training",
                 "complexity", "kv-cache", "moe", "bpe", "all"):
        assert f"'{kind}'" in err


@pytest.mark.parametrize("argv, message", [
    (["attention", "--model", "all-minilm-l6-v2", "--token", "banana"],
     "--token 'banana' is not a token of the text; its tokens are: '[CLS]' 'the' 'animal'"),
    (["attention", "--model", "all-minilm-l6-v2", "--cross"],
     "--cross needs an encoder–decoder model: a translation run"),
    (["attention", "--model", "all-minilm-l6-v2", "--layer", "6"], "--layer must be in 0..5, got 6"),
    (["attention", "--model", "all-minilm-l6-v2", "--head", "first"], "--head must be a head index or 'mean'"),
    (["attention", "--model", "all-minilm-l6-v2", "--head-for", "zebra"], "--head-for 'zebra' is not a token"),
    (["teacher-forcing", "--model", "all-minilm-l6-v2"],
     "all-minilm-l6-v2 is an encoder (BERT); the teacher-forcing figure needs a translation run"),
    (["kv-cache", "--model", "all-minilm-l6-v2"], "the kv-cache figure needs smollm2-135m, a GGUF file or a language"),
    (["moe", "--model", "all-minilm-l6-v2"], "the moe figure needs smollm2-135m"),
    (["context", "--model", "no/such/dir"], "no/such/dir is neither a model name"),
])
def test_bad_input_exits_2_with_one_line(capsys, tmp_path, argv, message, minilm):
    code, out, err = _run(capsys, *argv, "--out", tmp_path / "x.png")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert message in err


def test_training_without_metrics_names_the_file(capsys, tmp_path):
    code, _, err = _run(capsys, "training", "--runs", tmp_path, "--out", tmp_path / "t.png")
    assert code == 2 and f"{tmp_path / 'metrics.jsonl'} not found" in err


def test_attention_prints_the_heads_it_drew(capsys, tmp_path, minilm):
    code, out, err = _run(capsys, "attention", "--model", "all-minilm-l6-v2", "--token", "it", "--head-for", "animal",
                          "--out", tmp_path / "a.png", "--html", tmp_path / "a.html")
    assert code == 0, err
    result = json.loads(out)
    best = max((h for h in result["top_heads"] if h["token"] == "animal"), key=lambda h: h["weight"])
    assert (result["layer"], result["head"]) == (best["layer"], best["head"]) and result["position"] == 10
    assert (tmp_path / "a.png").is_file() and "http" not in (tmp_path / "a.html").read_text()


def test_bpe_is_the_tokenizer_picture(capsys, tmp_path):
    code, out, err = _run(capsys, "bpe", "--merges", 3, "--out", tmp_path / "b.png")
    assert code == 0 and len(json.loads(out)["merges"]) == 3 and json.loads(out)["merges"][0] == "er"
    assert "step 1: 'e' + 'r' -> 'er'" in err and (tmp_path / "b.png").stat().st_size < 150_000


@pytest.mark.parametrize("figure", ["attention", "kv-cache", "context"])
def test_a_mamba_run_is_refused_by_figures_that_need_attention(capsys, tmp_path, figure):
    run = tmp_path / "mamba-run"  # what kind_of reads: config.json's model_type beside the weights
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    (run / "model.safetensors").write_bytes(b"")
    code, out, err = _run(capsys, figure, "--model", run, "--out", tmp_path / "x.png")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{run} is a Mamba (state-space) model, which has no attention weights; the" in err
