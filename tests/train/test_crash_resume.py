"""Issue 13: a kill -9 at any file event of a run (inside each file write, around each rename of the
checkpoint, the snapshots and the best weights, in the end-of-run sequence) leaves a run directory
that resumes to exactly the uninterrupted run: bit-identical weights, Adam moments, RNG, best weights
and snapshots, the same state and metrics records, no temporary file left.

The run: 12 steps of a tiny character LM, a checkpoint every 4 steps (plus step 0), evaluations at
5 and 10 and a final one at 12, the last 2 checkpoints averaged. Its checkpoints, in order: #1 step
0, #2 step 4, #3 step 8, #4 step 12, #5 after the final evaluation (end "evaluated"), #6 after the
average (end "done").
"""
import pytest

from attnlab.tasks.registry import get_task
from attnlab.train.run_dir import has_checkpoint
from tests.conftest import tiny_lm_recipe
from tests.train.crash import assert_same_run, kill_at, reference_run

pytestmark = pytest.mark.usefixtures("one_thread")  # bit-for-bit comparisons: one thread, as the forked child

LM = get_task("gpt")
SETTINGS = ["checkpoint_every=4", "eval_every=5", "average_last=2", "log_every=2"]
CKPT = "*/.checkpoint.*.tmp"  # the temporary directory a checkpoint is written into

# name -> (ATTNLAB_CRASH_AT, fallback swap); {out} is the run directory
POINTS = {
    "inside the first checkpoint (step 0)": (f"partial:{CKPT}/model.safetensors#1", False),
    "inside a checkpoint file": (f"partial:{CKPT}/optimizer.safetensors#2", False),
    "checkpoint written, not swapped": ("written:*/checkpoint#3", False),
    "checkpoint swapped, old one not deleted": ("swapped:*/checkpoint#2", False),
    "between the fallback's two renames (issue case 1)": ("moved-aside:*/checkpoint#3", True),
    "fallback: swapped, backup not deleted": ("swapped:*/checkpoint#2", True),
    "inside the best weights": ("partial:{out}/model.safetensors#1", False),
    "best weights swapped, before the checkpoint": ("swapped:{out}/model.safetensors#2", False),
    "first checkpoint after an evaluation (case 2)": (f"partial:{CKPT}/model.safetensors#3", False),
    "while a snapshot is written (case 4)": ("swap:*/snapshots/step_00000008.safetensors", False),
    "inside the final checkpoint (case 3)": (f"partial:{CKPT}/optimizer.safetensors#5", False),
    "after the final evaluation, before averaging (case 4)": ("swapped:*/checkpoint#5", False),
    "after the average was evaluated, before the last checkpoint": ("written:*/checkpoint#6", False),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Tiny data for the module, and the uninterrupted run."""
    yield from reference_run(tmp_path_factory, lambda out: LM.train(tiny_lm_recipe(12, SETTINGS), out))


@pytest.mark.parametrize("point", list(POINTS))
def test_a_kill_at_any_file_event_resumes_to_the_uninterrupted_run(reference, tmp_path, point):
    out = tmp_path / "run"
    crash_at, fallback = POINTS[point]
    kill_at(lambda: LM.train(tiny_lm_recipe(12, SETTINGS), out), crash_at.format(out=out), fallback)
    # the advice the CLI gives: --resume where there is a checkpoint, else the same command again
    LM.train(tiny_lm_recipe(12, SETTINGS), out, resume=has_checkpoint(out))
    assert_same_run(reference, out)
