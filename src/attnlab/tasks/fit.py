"""Training a prepared model with the shared loop (train/loop.py): the checks before anything is
written when several processes train, and the final record of a run."""
from __future__ import annotations

from pathlib import Path

from attnlab.errors import UserError
from attnlab.models.base import Model
from attnlab.train import distributed
from attnlab.train.config import TrainConfig
from attnlab.train.loop import Trainer, optimizer_factory
from attnlab.train.objective import Objective
from attnlab.train.parallel import check_shardable, make_strategy


def check_world(objective, model: Model, parallel: str) -> None:
    """Several processes: refuse more of them than the rows (sentences, sequences, images) of the
    first global batch, and a model that `parallel` "fsdp" cannot shard; before anything is written.

    Raises:
        UserError: one line ("mismatched world size" naming both numbers; parallel.check_shardable).
    """
    world = distributed.current_world()
    if world.distributed:
        if parallel == "fsdp":
            check_shardable(model)
        first = objective.batch_rows(objective.batches(0)[0])
        if first < world.size:
            raise UserError(f"mismatched world size: {world.size} processes cannot split a global batch of "
                            f"{first} rows (sentences, sequences or images); use at most {first} processes or a "
                            f"larger batch")


def fit(model: Model, objective: Objective, train_cfg: TrainConfig, out: Path, resume: bool,
        rate_key: str = "tokens_per_s") -> dict:
    """Train with the shared loop (resuming from out/checkpoint when asked) and return the final
    record with "parameters", "steps" and the training rate under `rate_key` (units the objective's
    loss counts: tokens, sentences or images per second). Under torchrun the model runs as
    train_cfg.parallel says (train/parallel.py). The Noam schedule reads the model's width,
    model.cfg.d_model (every model config has one).

    Raises:
        UserError: for a model FSDP cannot shard (parallel.check_shardable).
    """
    strategy = None
    if distributed.current_world().distributed:
        strategy = make_strategy(model, objective, optimizer_factory(train_cfg), train_cfg.parallel)
    trainer = Trainer(model, objective=objective, cfg=train_cfg, out=out, d_model=model.cfg.d_model,
                      strategy=strategy)
    if resume:
        trainer.resume()
    record = trainer.fit()
    s = trainer.state
    return {**record, "parameters": model.num_parameters(), "steps": s.step,
            rate_key: round(s.tokens / max(s.elapsed_s, 1e-9), 1)}
