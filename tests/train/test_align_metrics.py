"""Resuming puts metrics.jsonl back as its checkpoint recorded it (train/run_dir.align_with_checkpoint)."""
import json

from attnlab.train.run_dir import align_with_checkpoint
from attnlab.train.state import TrainState

LINES = [json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 6)]


def test_records_written_after_the_checkpoint_are_cut(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(LINES))
    align_with_checkpoint(tmp_path, TrainState(step=3, metrics_bytes=len("".join(LINES[:3]))))
    assert (tmp_path / "metrics.jsonl").read_text() == "".join(LINES[:3])


def test_a_file_cut_shorter_keeps_its_whole_lines_and_says_so(tmp_path, caplog):
    """A tester cut metrics.jsonl to 200 bytes, shorter than its checkpoint's record: the resume
    appended to the cut line ('{"st{"step": 110, ...'), an invalid file, with no word."""
    full = "".join(LINES)
    (tmp_path / "metrics.jsonl").write_text(full[:len(LINES[0]) + 7])  # one whole line and a piece
    align_with_checkpoint(tmp_path, TrainState(step=5, metrics_bytes=len(full)))
    assert (tmp_path / "metrics.jsonl").read_text() == LINES[0]
    assert "shorter than the" in caplog.text and "metrics.jsonl" in caplog.text
