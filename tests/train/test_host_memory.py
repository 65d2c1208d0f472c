"""train/host_memory.py: on glibc, blocks from the threshold on are mapped and given back when freed
(the resident memory falls with the freed tensor), and a Trainer of a checkpointing model applies it."""
from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch

from attnlab.train import host_memory

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


def resident_mb() -> float:
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(status["VmRSS"].split()[0]) / 1024


@glibc
def test_a_freed_large_block_leaves_the_resident_memory():
    assert host_memory.map_large_blocks() and host_memory.map_large_blocks()  # idempotent
    before = resident_mb()
    t = torch.ones(64 << 18)  # 64 MiB, touched
    assert resident_mb() - before > 60
    del t
    assert resident_mb() - before < 8


def test_a_trainer_of_a_checkpointing_model_maps_large_blocks(monkeypatch, tmp_path):
    from attnlab.train import loop
    calls = []
    monkeypatch.setattr(loop, "map_large_blocks", lambda: calls.append(1))
    model = torch.nn.Linear(2, 2)
    model.checkpoint_layers = True
    objective = type("Objective", (), {"leaves_parameters_unused": False})()
    loop.Trainer(model, objective, loop.TrainConfig(max_steps=1), tmp_path, 2)
    assert calls == [1]
    model.checkpoint_layers = False
    loop.Trainer(model, objective, loop.TrainConfig(max_steps=1), tmp_path / "plain", 2)
    assert calls == [1]  # a run that keeps its activations keeps glibc's default
