"""training: curves come from metrics.jsonl as written by the training loop; a run without one is named."""
import json

import pytest

from attnlab.viz import training


def _run(tmp_path, name, records):
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_reads_log_evaluation_and_averaged_records(tmp_path):
    a = _run(tmp_path, "mt", [{"step": 50, "loss": 7.1, "lr": 1e-4, "elapsed_s": 9},
                              {"step": 100, "loss": 6.0, "lr": 2e-4, "elapsed_s": 18},
                              {"step": 100, "val_loss": 5.5, "val_ppl": 244.7, "val_bleu": 2.1, "best": 2.1},
                              {"step": 100, "val_loss": 5.4, "val_bleu": 2.5, "averaged": ["a", "b"], "best": 2.5}])
    b = _run(tmp_path, "lm", [{"step": 50, "loss": 2.5, "lr": 1e-3},
                              {"step": 250, "val_loss": 2.0, "perplexity": 7.4, "bits_per_byte": 2.9}])
    runs = training.training_curves([str(a), str(b)])
    assert runs[0].train["step"] == [50, 100] and runs[0].train["loss"] == [7.1, 6.0]
    assert runs[0].val["val_bleu"] == [2.1] and runs[0].quality == "val_bleu" and len(runs[0].averaged) == 1
    assert runs[1].quality == "bits_per_byte" and runs[1].val["val_loss"] == [2.0]
    training.draw_training(runs, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 1000
    assert "mt: best validation loss 5.500" in training.caption(runs)


def test_missing_metrics_names_the_file(tmp_path):
    with pytest.raises(ValueError, match=f"{tmp_path / 'metrics.jsonl'} not found"):
        training.read_metrics(tmp_path)


def test_bad_line_is_named(tmp_path):
    run = _run(tmp_path, "bad", [{"step": 1, "loss": 1.0}])
    with open(run / "metrics.jsonl", "a") as f:
        f.write("[1, 2]\n")
    with pytest.raises(ValueError, match="metrics.jsonl line 2 is not a JSON object"):
        training.read_metrics(run)
