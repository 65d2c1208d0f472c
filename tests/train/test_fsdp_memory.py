"""FSDP shards the memory, not only the arithmetic: between evaluations and checkpoints every
process holds half of the parameters and of Adam's moments (two processes) and no full copy;
rank 0 holds the full weights and moments only from a gather (equal to the shards' full tensors)
to the next step."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.train.distributed_runs import env, free_port

WORKER = Path(__file__).with_name("fsdp_memory_worker.py")


def test_fsdp_processes_hold_half_the_model_and_rank_0_a_full_copy_only_when_gathered(dist_data, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(WORKER), str(tmp_path)]
    done = subprocess.run(cmd, env=env(dist_data), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    total = rank0["total"]
    for rank in (rank0, rank1):
        # dim 0 of each tensor is split in two (padded to even): each shard is about half
        assert rank["stepped"]["shards"] + rank1["stepped"]["shards"] >= total
        assert abs(rank["stepped"]["shards"] - total / 2) <= 0.02 * total
        assert rank["stepped"]["moments"] == 2 * rank["stepped"]["shards"]  # exp_avg and exp_avg_sq
        assert rank["stepped"]["plain"] == rank["released"]["plain"] == 0
        assert rank["stepped"]["plain_moments"] == rank["released"]["plain_moments"] == 0
    assert rank1["built"]["plain"] == rank1["gathered"]["plain"] == 0  # never a full copy
    assert rank0["built"]["plain"] == rank0["gathered"]["plain"] == total
    assert rank0["gathered"]["plain_moments"] == 2 * total
    assert rank0["max_difference"] == 0.0
