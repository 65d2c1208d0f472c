"""One training loop for every recipe.

An objective (train/objective.py's Objective, made by a task family, tasks/) supplies the data and
the loss. The loop owns the optimiser and schedule, gradient accumulation (token-weighted) and clipping, the budgets, logging (progress bar on
stderr, metrics.jsonl), checkpoints, resuming, keeping the best weights and averaging the last ones.

Crash safety: a fresh run writes a checkpoint of step 0 before anything else, so a run directory
always has a state to resume from; a resume first puts the directory back in the state its
checkpoint describes (run_dir.align_with_checkpoint) and then replays the same steps, so any kill
resumes to exactly the uninterrupted result; the end of the run is a sequence of recorded stages
(train/end_of_run.py). Non-finite losses or weights stop training before anything is written.

Several processes (torchrun; train/distributed.py, train/parallel.py): each global batch is split
across the processes, gradients are summed over them and divided by the global count, so the steps,
schedule and losses are those of one process; rank 0 alone evaluates and writes (logs, progress bar,
metrics.jsonl, weights, checkpoints), and every decision that ends or changes the loop (a stop
signal, the time budget, an evaluation's result, a non-finite loss) is taken once for all processes.
"""
from __future__ import annotations

import errno
import json
import logging
import math
import signal
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from attnlab.errors import NonFiniteError, UserError
from attnlab.files import DiskFullError, crash_point
from attnlab.nn import quant_kernel
from attnlab.train import distributed
from attnlab.train.checkpoint import load_training_state, save_training_state, save_weights
from attnlab.train.config import TrainConfig
from attnlab.train.end_of_run import finish
from attnlab.train.guards import StopSignals, TrainingInterrupted, check_finite_weights
from attnlab.train.optim import (budget_cosine_lr, budget_warmup, build_optimizer, clip_normalised_, cosine_lr,
                                 noam_lr, set_lr, warmup_steps_for)
from attnlab.train.parallel import OneProcess
from attnlab.train.run_dir import CHECKPOINT_DIR, align_with_checkpoint, take_snapshot, weights_path
from attnlab.train.objective import Objective
from attnlab.train.speed import autocast_context, compile_for_training, eager
from attnlab.train.state import TrainState

log = logging.getLogger("attnlab")


def decays_over_minutes(cfg: TrainConfig) -> bool:
    """Whether cfg's learning rate follows the time spent: a cosine schedule with no step horizon
    (lr_decay_steps, max_steps) and a minutes budget."""
    return cfg.lr_schedule == "cosine" and cfg.lr_decay_steps is None and cfg.max_steps is None \
        and cfg.minutes is not None


def warms_up_over_minutes(cfg: TrainConfig) -> bool:
    """Whether cfg's warm-up follows the time spent too: a warmup_ratio, no step horizon and a
    minutes budget (the cosine over minutes, or the constant schedule)."""
    return cfg.warmup_ratio > 0 and cfg.lr_schedule != "noam" and cfg.lr_decay_steps is None \
        and cfg.max_steps is None and cfg.minutes is not None


def learning_rate(cfg: TrainConfig, step: int, d_model: int, budget_fraction: float | None = None) -> float:
    """The learning rate of (1-based) `step` under cfg's schedule; budget_fraction is the part of
    the minutes budget spent, which a cosine schedule with no step horizon decays over
    (decays_over_minutes; optim.budget_cosine_lr). A warmup_ratio shortens the warm-up to that
    fraction of the run when it is shorter than warmup_steps: of its steps with a step horizon
    (optim.warmup_steps_for), of the minutes budget without one (optim.budget_warmup).

    Raises:
        UserError: for a cosine schedule with no horizon (lr_decay_steps, max_steps, minutes).
        ValueError: for one that follows the minutes when budget_fraction is not given.
    """
    if cfg.lr_schedule == "noam":
        return noam_lr(step, d_model, cfg.warmup_steps, cfg.lr_factor)
    horizon = cfg.lr_decay_steps or cfg.max_steps
    warmup = warmup_steps_for(cfg.warmup_steps, cfg.warmup_ratio, horizon) if horizon else cfg.warmup_steps
    if cfg.lr_schedule == "cosine":
        if horizon is not None:
            return cosine_lr(step, cfg.lr, cfg.min_lr, warmup, horizon)
        if cfg.minutes is None:
            raise UserError("lr_schedule 'cosine' needs lr_decay_steps or a budget (max_steps or minutes)")
        if budget_fraction is None:
            raise ValueError("lr_schedule 'cosine' over a minutes budget needs the fraction of it spent")
        return budget_cosine_lr(step, budget_fraction, cfg.lr, cfg.min_lr, warmup, cfg.warmup_ratio)
    if warms_up_over_minutes(cfg):
        if budget_fraction is None:
            raise ValueError("a warmup_ratio over a minutes budget needs the fraction of it spent")
        return cfg.lr * budget_warmup(step, budget_fraction, warmup, cfg.warmup_ratio)
    return cfg.lr * min(1.0, step / warmup)


def optimizer_factory(cfg: TrainConfig):
    """model -> the optimizer of cfg for it (its learning rate is set at each step)."""
    return lambda model: build_optimizer(model, 0.0, (cfg.beta1, cfg.beta2), cfg.eps, cfg.weight_decay,
                                         cfg.optimizer_impl)


class Trainer:
    """Trains `model` on `objective` under `cfg`, writing into run directory `out`.

    Args:
        model: the module to train. objective: its data and loss (train/objective.py). cfg: TrainConfig.
        out: run directory (holds the best weights, model.safetensors or a LoRA run's adapter:
            run_dir.weights_path; metrics.jsonl, checkpoint/).
        d_model: the model's width D, for the Noam schedule (lr ∝ D^-0.5).
        strategy: how the model runs over processes (train/parallel.make_strategy, built with
            make_optimizer); None: this process alone.
        save_best: writes the best weights, save_best(model, path) (default checkpoint.save_weights;
            a LoRA run's writes its adapter in PEFT's format).
    """

    def __init__(self, model: torch.nn.Module, objective: Objective, cfg: TrainConfig, out: Path, d_model: int,
                 strategy=None, save_best=save_weights):
        self.objective, self.cfg, self.out, self.d_model = objective, cfg, Path(out), d_model
        compile_for_training(model, cfg.compile)
        self.save_best = save_best
        self.strategy = strategy or OneProcess(model, objective, optimizer_factory(cfg))
        self.model = self.strategy.model          # the plain model: evaluated and saved
        self.optimizer = self.strategy.optimizer  # its optimizer: saved in checkpoints
        self.main = self.strategy.world.is_main
        self.signals = StopSignals()
        self.state = TrainState()
        self._resumed = False
        self._clock = time.perf_counter()  # run() restarts it; elapsed() holds for a step taken outside run()

    def log(self, record: dict) -> None:
        """Append `record` to metrics.jsonl (a resume cuts what came after its checkpoint); rank 0 only.

        Raises:
            files.DiskFullError: when the device is full.
        """
        if not self.main:
            return
        line = json.dumps(record) + "\n"
        try:
            with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(line)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise DiskFullError(self.out, len(line)) from None
            raise

    def resume(self) -> None:
        """Continue from the run directory's checkpoint (weights, optimiser, step, data position, RNG),
        after putting the directory back in the state the checkpoint describes. Rank 0 alone reads
        it; the other processes receive it from rank 0 (strategy.scatter), whatever the number of
        processes that wrote it."""
        state = None
        if self.main:
            state = load_training_state(self.out / CHECKPOINT_DIR, self.model, self.optimizer)
            align_with_checkpoint(self.out, state)
            state.optimizer = None
        state, rng = distributed.from_main((state, torch.get_rng_state()))
        torch.set_rng_state(rng)
        self.strategy.scatter()
        self.state, self._resumed = state, True

    def checkpoint(self, snapshot: bool = False) -> None:
        """Write the checkpoint; with `snapshot`, also keep its weights among the last
        cfg.average_last snapshots (listed in the state before the checkpoint, linked after it).
        Rank 0 writes; every process takes part (FSDP gathers the shards)."""
        s = self.state
        if snapshot:
            s.snapshots = sorted(set(s.snapshots) | {s.step})[-self.cfg.average_last:]
        self.strategy.gather(optimizer=True)
        if not self.main:
            return
        metrics = self.out / "metrics.jsonl"
        s.metrics_bytes = metrics.stat().st_size if metrics.is_file() else 0
        best = weights_path(self.out) if s.best is not None else None
        save_training_state(self.out / CHECKPOINT_DIR, self.model, self.optimizer, s, best)
        if snapshot:
            take_snapshot(self.out, s.step, s.snapshots)

    def elapsed(self) -> float:
        """Seconds of training so far, across resumes."""
        return self.state.elapsed_s + time.perf_counter() - self._clock

    def _budget_left(self) -> bool:
        s, cfg = self.state, self.cfg
        if cfg.max_steps is not None and s.step >= cfg.max_steps:
            return False
        return cfg.minutes is None or distributed.from_main(self.elapsed() < cfg.minutes * 60)

    def _evaluate(self, **extra) -> dict:
        """Validate, log the record (with `extra` fields and "eval_s", the seconds it took) and keep
        the weights if they are the best. It runs in fp32 and eager whatever the training step's
        autocast and compile (train/speed.py): the best weights are chosen on, and the records
        report, the numbers `attnlab evaluate` gives for the saved weights. Rank 0 evaluates the
        plain model once and writes; the others receive its numbers. The seconds add up in state.spent_s ("average" for the
        averaged weights' evaluation, else "evaluate")."""
        t0 = time.perf_counter()
        self.strategy.gather()
        metrics = None
        if self.main:
            self.model.eval()
            with torch.no_grad(), eager():  # fp32 eager, whatever the step runs in: `attnlab evaluate`'s numbers
                metrics = self.objective.evaluate(self.model)
            self.model.train()
        metrics = distributed.from_main(metrics)
        s = self.state
        value = metrics[self.objective.best_metric]
        sign = 1 if self.objective.higher_is_better else -1
        improved = s.best is None or sign * value > sign * s.best
        if improved:
            if self.main:
                self.save_best(self.model, weights_path(self.out))
            s.best, s.best_step = value, s.step
        seconds = time.perf_counter() - t0
        s.spent_s["average" if "averaged" in extra else "evaluate"] += seconds
        record = {"step": s.step, "epoch": s.epoch, "elapsed_s": round(self.elapsed(), 1), **metrics,
                  **extra, "best": s.best, "eval_s": round(seconds, 2)}
        self.log(record)
        s.last_eval = record
        return record

    def _train_step(self, micro_batches: list) -> tuple[float, int]:
        """One optimizer step over cfg.grad_accum_steps micro-batches.

        The step's loss is Σ (token losses) / Σ (tokens) over the whole accumulation window, each
        micro-batch weighted by the count its objective reports (target tokens, masked tokens,
        sentences or images), so the gradient equals the gradient of the same examples as one
        batch. Each micro-batch's mean loss is back-propagated times its count, and the summed
        gradient is divided by the window's count before clipping (the fault of
        huggingface/transformers#24725: averaging per-micro-batch means weighs a short micro-batch's
        tokens more). With several processes the same rule spans them: each runs its part of every
        micro-batch (strategy.share), the gradients are summed over the processes (strategy.sync, on
        the window's last micro-batch) and the counts too (an all-reduce), and the sum is divided by
        that global count — not by each process's own, which would weigh a process's tokens by how
        few it had.

        Returns:
            (the window's mean loss per counted item, the count), over all processes.
        Raises:
            FloatingPointError: when a loss is not finite (nothing is updated), or when the update
                left a weight non-finite (guards.check_finite_weights); nothing is written. With
                several processes every process raises it.
        """
        s, cfg, strategy = self.state, self.cfg, self.strategy
        optimizer, module = strategy.step_optimizer, strategy.train_module
        fraction = None
        if decays_over_minutes(cfg) or warms_up_over_minutes(cfg):  # the same for every process: rank 0's clock
            fraction = distributed.from_main(self.elapsed() / (cfg.minutes * 60))
        lr = learning_rate(cfg, s.step + 1, self.d_model, fraction)
        set_lr(optimizer, lr)
        optimizer.zero_grad(set_to_none=True)
        strategy.release()  # the trained state changes: FSDP's rank 0 drops its full copy
        total, n_tokens = 0.0, 0
        for i, batch in enumerate(micro_batches):
            part, weight = strategy.share(batch)
            with strategy.sync(last=i == len(micro_batches) - 1):
                with autocast_context(cfg.autocast):
                    loss, n = strategy.loss(part)
                if not torch.isfinite(loss) and not strategy.world.distributed:
                    self._diverged(loss.item())
                n = n * weight
                (loss * n).backward()
            total += loss.item() * n
            n_tokens += n
        total, n_tokens = distributed.all_sum(total, n_tokens)
        if not math.isfinite(total):  # several processes: every one learns of any process's loss
            self._diverged(total)
        n_tokens = int(n_tokens)
        scale = 1.0 / max(n_tokens, 1)
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        if cfg.clip_grad_norm > 0 and not strategy.world.distributed:
            clip_normalised_(grads, scale, cfg.clip_grad_norm)
        else:
            torch._foreach_mul_(grads, scale)  # one call for every gradient
            if cfg.clip_grad_norm > 0:  # sharded or replicated: torch's clipping knows their norms
                torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.clip_grad_norm, foreach=True)
        optimizer.step()
        check_finite_weights(module, s.step + 1, agree=lambda ok: not distributed.any_true(not ok))
        s.step += 1
        s.tokens += n_tokens
        return total * scale, n_tokens

    def _diverged(self, loss: float) -> None:
        self.strategy.step_optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError(
            f"the loss is {loss} at step {self.state.step + 1}: training diverged (lower lr_factor / lr "
            f"or raise warmup_steps); the weights were not updated and the last checkpoint is intact")

    def fit(self) -> dict:
        """Train until a budget (cfg.max_steps, cfg.minutes) runs out, then run the end-of-run sequence
        (end_of_run.finish: final evaluation, checkpoint, average of the last snapshots). Ctrl-C or
        SIGTERM finishes the current step, writes a checkpoint and raises TrainingInterrupted (a
        KeyboardInterrupt); a second one aborts at once.

        Returns:
            the final evaluation record, with "best" and "best_step".
        Raises:
            FloatingPointError: training diverged (guards). files.DiskFullError. ValueError: a
                checkpoint whose data position does not fit the data.
        """
        s = self.state
        if self.main:
            self.out.mkdir(parents=True, exist_ok=True)
        self.model.train()
        self.strategy.train_module.train()
        if any(p.device.type == "cpu" for p in self.model.parameters()):
            quant_kernel.kernel()  # a first build of the C++ extension (~1 min) comes before the clock, not in step 1
        self._clock = time.perf_counter()
        with self.signals:
            if not self._resumed:
                self._save()  # step 0: from here on there is always a checkpoint to resume from
            if s.end == "done" and not self._budget_left():
                log.info("the run already finished at step %d (%.0f s); raise --steps or --minutes to train longer",
                         s.step, s.elapsed_s)
                return {**s.last_eval, "best": s.best, "best_step": s.best_step}
            if self._budget_left():
                s.end = None
                self._train()
            return finish(self)

    def _train(self) -> None:
        cfg, s = self.cfg, self.state
        window_t, window_tok = time.perf_counter(), 0
        bar = tqdm(total=cfg.max_steps, initial=s.step, unit="step", dynamic_ncols=True, leave=False,
                   mininterval=2.0, disable=not self.main)
        try:
            while self._budget_left():
                batches = self.objective.batches(s.epoch)
                if not 0 <= s.position <= len(batches):
                    raise UserError(f"{self.out / CHECKPOINT_DIR / 'state.json'}: position must be in "
                                    f"0..{len(batches)} (the batches of epoch {s.epoch}), got {s.position}")
                while s.position < len(batches) and self._budget_left():
                    group = batches[s.position:s.position + cfg.grad_accum_steps]
                    loss, n = self._train_step(group)
                    crash_point("step", self.out / f"rank{self.strategy.world.rank}" / f"step_{s.step}")
                    s.position += len(group)
                    window_tok += n
                    bar.update(1)
                    if s.step % cfg.log_every == 0:
                        now = time.perf_counter()
                        tps = window_tok / max(now - window_t, 1e-9)
                        lr = self.strategy.step_optimizer.param_groups[0]["lr"]
                        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tps:.0f}")
                        self.log({"step": s.step, "epoch": s.epoch, "loss": round(loss, 4),
                                  "lr": lr, "tokens_per_s": round(tps, 1),
                                  "elapsed_s": round(self.elapsed(), 1)})
                        window_t, window_tok = now, 0
                    if s.step % cfg.eval_every == 0:
                        record = self._evaluate()
                        if self.main:
                            bar.write(json.dumps(record), file=sys.stderr)
                        window_t, window_tok = time.perf_counter(), 0  # keep eval time out of tokens/s
                    saved = s.step % cfg.checkpoint_every == 0
                    if saved:
                        self._save(snapshot=bool(cfg.average_last))
                    if self.stop_requested():  # the step and its evaluation are complete: exact
                        if not saved:
                            self._save()
                        raise TrainingInterrupted(self.signals.signum or signal.SIGTERM)
                if s.position >= len(batches):
                    s.epoch, s.position = s.epoch + 1, 0
        finally:
            bar.close()

    def stop_requested(self) -> bool:
        """Whether a stop signal (Ctrl-C, SIGTERM) reached this process or, with several, any of them."""
        return distributed.any_true(self.signals.signum is not None)

    def _save(self, snapshot: bool = False) -> None:
        """Write a checkpoint; its seconds are counted in state.spent_s["checkpoint"] from the next
        checkpoint on (a checkpoint cannot hold its own duration) and in elapsed_s."""
        t0 = time.perf_counter()
        self.state.elapsed_s = self.elapsed()
        self._clock = t0
        self.checkpoint(snapshot)
        self.state.spent_s["checkpoint"] += time.perf_counter() - t0

    def time_spent(self) -> dict:
        """Where the training seconds (elapsed_s) went: "train_steps" (the optimizer steps, data and
        logging included), "evaluate" (validations), "checkpoint" (writing checkpoints and
        snapshots), "average" (evaluating the average of the last snapshots)."""
        spent = {k: round(v, 1) for k, v in self.state.spent_s.items()}
        return {"train_steps": round(self.elapsed() - sum(self.state.spent_s.values()), 1), **spent}
