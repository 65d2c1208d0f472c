"""The pieces of distributed training that need no second process: the split of a global batch, the
one-line errors (a mismatched world size, a missing MASTER_ADDR, FSDP on a model it cannot shard),
and two "nodes" on 127.0.0.1 (two torchrun launchers of one process each, c10d rendezvous)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import attnlab.tasks.text_classification as tc
from attnlab.cli import main
from attnlab.data.wordpiece import train_wordpiece
from attnlab.recipes import get_recipe
from attnlab.data.sharding import share, shard_rows
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.tasks.base import check_world
from attnlab.train import distributed
from attnlab.train.distributed import World, world_from_env
from attnlab.train.parallel import check_shardable
from tests.train.distributed_runs import LM, env, free_port, max_difference, weights


@pytest.mark.parametrize("n, world", [(17, 2), (16, 2), (5, 3), (1, 2), (0, 4)])
def test_shards_are_disjoint_contiguous_and_cover_the_batch(n, world):
    rows = [shard_rows(n, r, world) for r in range(world)]
    assert [i for r in rows for i in r] == list(range(n))
    assert max(map(len, rows)) - min(map(len, rows)) <= 1


def test_a_rank_left_without_rows_runs_rank_0s_with_weight_0():
    assert share(1, 1, 2) == (range(0, 1), 0.0)
    assert share(3, 1, 2) == (range(2, 3), 1.0)


@pytest.mark.parametrize("environ, message", [
    ({"WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
     "mismatched world size: RANK=2"),
    ({"WORLD_SIZE": "two"}, "$WORLD_SIZE must be an integer"),
    ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_PORT": "1"}, "$MASTER_ADDR is not set"),
])
def test_a_bad_torchrun_environment_is_a_one_line_error(monkeypatch, capsys, environ, message):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message.replace("$", r"\$")):
        world_from_env()
    assert main(["train", "--recipe", "shakespeare-char", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_one_process_without_torchrun_is_the_single_process_world(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert world_from_env() == World() and not World().distributed


def test_fsdp_refuses_a_mixture_of_experts():
    model = GPT(GPTConfig(vocab_size=32, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8, n_experts=4,
                          moe_top_k=2))
    with pytest.raises(ValueError, match="parallel=fsdp cannot shard GPT with n_experts=4.*parallel=ddp"):
        check_shardable(model)


def test_more_processes_than_rows_of_a_batch_is_refused(monkeypatch):
    class OneRow:
        def batches(self, epoch):
            return [[7]]

        def batch_rows(self, batch):
            return len(batch)

    monkeypatch.setattr(distributed, "_world", World(0, 2))
    with pytest.raises(ValueError, match="mismatched world size: 2 processes cannot split a global batch of 1 rows"):
        check_world(OneRow(), torch.nn.Linear(2, 2), "ddp")


def test_two_nodes_on_localhost_train_the_model_of_one_process(runs, tmp_path):
    out, port = tmp_path / "run", free_port()
    argv = [*LM, "--set", "parallel=fsdp", "--steps", "5", "--out", str(out)]
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(k),
                               "--nproc_per_node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                               f"127.0.0.1:{port}", "--rdzv-id", "test", "-m", "attnlab", "train", *argv],
                              env=env(runs.data), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in (0, 1)]
    results = [node.communicate(timeout=120) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], results[0][1][-2000:] + results[1][1][-2000:]
    assert sum(len(stdout.strip().splitlines()) for stdout, _ in results) == 1  # rank 0's result only
    assert max_difference(weights(out), weights(runs.one("lm"))) < 1e-5


def test_every_process_takes_rank_0s_wordpiece_vocabulary(monkeypatch):
    """HF's WordPiece training is not deterministic: processes that each trained their own would
    disagree on token ids (a BERT trained from scratch by torchrun would mix vocabularies)."""
    rank0 = train_wordpiece(["the cat sat on the mat", "a dog ran"], 120)
    monkeypatch.setattr(tc, "pretraining_sentences", lambda: ["other text"])
    monkeypatch.setattr(tc, "train_wordpiece", lambda *a: pytest.fail("rank 1 trained its own tokenizer"))
    monkeypatch.setattr(distributed, "_world", World(1, 2))
    monkeypatch.setattr(distributed, "from_main", lambda obj: rank0.to_str())
    recipe = tc.TextClassificationDataConfig(objective="mlm", tokenizer_vocab_size=120)
    spec = tc.RunSpec(None, False, "bert-mlm", get_recipe("bert-mlm").model, recipe, None, None)
    _, tok, _, _ = tc.BertTask()._initial(spec)
    assert tok.get_vocab() == rank0.get_vocab()
