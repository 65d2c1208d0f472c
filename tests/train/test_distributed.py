"""Two processes (torchrun, gloo, one thread each) on B/2 of every global batch train the same
model as one process on B: DDP and FSDP2, translation (uneven token counts per rank) and a language
model; rank 0 alone writes the run directory."""
from __future__ import annotations

import json

import pytest

from tests.train.crash import TIMINGS
from tests.train.distributed_runs import max_difference, weights


def records(run):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return lines, [{k: v for k, v in json.loads(line).items() if k not in TIMINGS} for line in lines]


@pytest.mark.parametrize("kind, parallel", [("translation", "ddp"), ("translation", "fsdp"), ("lm", "ddp")])
def test_two_processes_train_the_model_of_one(runs, kind, parallel):
    one = runs.one(kind)
    two, result = runs.two(kind, parallel)
    # parameters after 5 optimizer steps (fp32, dropout 0); FSDP's gathered from the shards
    assert max_difference(weights(one), weights(two)) < 1e-5
    # the same steps, schedule, losses and evaluations, each line once (rank 0 alone logs)
    lines, got = records(two)
    _, want = records(one)
    assert len(lines) == len(set(lines)) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys() and g["step"] == w["step"] and g.get("lr") == w.get("lr")
        for key in ("loss", "val_loss"):
            if key in w:
                assert g[key] == pytest.approx(w[key], abs=2e-4)
    # one JSON result on stdout, the same files as one process writes
    assert len(result.stdout.strip().splitlines()) == 1 and json.loads(result.stdout)["steps"] == 5
    assert sorted(p.name for p in two.rglob("*")) == sorted(p.name for p in one.rglob("*"))
