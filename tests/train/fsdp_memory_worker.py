"""One process of tests/train/test_fsdp_memory.py (launched by torchrun): builds the FSDP strategy
over a tiny GPT, trains one step, and writes what each process holds at each stage to
OUT/rank<R>.json: the plain model's parameter elements, the local shards' elements, Adam's moment
elements, and on rank 0 whether its gathered copy equals the full tensors."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.models.gpt import GPT, GPTConfig
from attnlab.train import distributed
from attnlab.train.optim import build_optimizer
from attnlab.train.parallel import FSDP


class NextToken:
    """A language-model objective over a (rows, T) batch of token ids."""

    def loss(self, model, batch):
        logits = model(batch[:, :-1]).logits
        return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()), batch[:, 1:].numel()

    def batch_rows(self, batch):
        return batch.shape[0]

    def shard(self, batch, rows):
        return batch[rows.start:rows.stop]


def elements(tensors) -> int:
    return sum((t.to_local() if hasattr(t, "to_local") else t).numel() for t in tensors)


def held(strategy) -> dict:
    moments = [v for s in strategy.step_optimizer.state.values() for k, v in s.items() if k != "step"]
    plain_moments = [v for s in strategy.optimizer.state.values() for k, v in s.items() if k != "step"]
    return {"plain": elements(strategy.model.parameters()), "shards": elements(strategy.module.parameters()),
            "moments": elements(moments), "plain_moments": elements(plain_moments)}


def main(out: Path) -> None:
    with distributed.process_group() as world:
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, max_seq_len=16, dropout=0.0))
        total = sum(p.numel() for p in model.parameters())
        strategy = FSDP(model, NextToken(), lambda m: build_optimizer(m, 1e-3, (0.9, 0.98), 1e-8), world)
        record = {"total": total, "built": held(strategy)}
        strategy.release()
        batch = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(1))
        part, weight = strategy.share(batch)
        loss, n = strategy.loss(part)
        (loss * n * weight).backward()
        strategy.step_optimizer.step()
        record["stepped"] = held(strategy)
        strategy.gather(optimizer=True)
        record["gathered"] = held(strategy)
        full = {name.removeprefix("model."): p.full_tensor() for name, p in strategy.module.named_parameters()}
        if world.is_main:
            plain = dict(strategy.model.named_parameters())
            record["max_difference"] = max((plain[k] - v).abs().max().item() for k, v in full.items())
        strategy.release()
        record["released"] = held(strategy)
        (out / f"rank{world.rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
