"""One training loop for every recipe.

An objective (made by a task family, tasks/) supplies the data and the loss: `batches(epoch)` (a
deterministic list of batches for that epoch), `loss(model, batch) -> (loss, n_tokens)`,
`evaluate(model) -> dict`, `best_metric` (a key of evaluate()'s dict) and optionally
`higher_is_better` (default True). The loop owns the
optimiser and schedule, gradient accumulation (token-weighted) and clipping, the budgets, logging (progress bar on
stderr, metrics.jsonl), checkpoints, resuming, keeping the best weights and averaging the last ones.
"""
from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path

import torch
from tqdm import tqdm

from attnlab.train.config import TrainConfig
from attnlab.train.checkpoint import load_training_state, load_weights, save_training_state, save_weights
from attnlab.train.optim import build_optimizer, cosine_lr, noam_lr, set_lr
from attnlab.train.run_dir import CHECKPOINT_DIR, SNAPSHOT_DIR

log = logging.getLogger("attnlab")


def learning_rate(cfg: TrainConfig, step: int, d_model: int) -> float:
    """The learning rate of (1-based) `step` under cfg's schedule."""
    if cfg.lr_schedule == "noam":
        return noam_lr(step, d_model, cfg.warmup_steps, cfg.lr_factor)
    if cfg.lr_schedule == "cosine":
        decay_steps = cfg.lr_decay_steps or cfg.max_steps
        if decay_steps is None:
            raise ValueError("lr_schedule 'cosine' needs lr_decay_steps or a step budget (--steps)")
        return cosine_lr(step, cfg.lr, cfg.min_lr, cfg.warmup_steps, decay_steps)
    return cfg.lr * min(1.0, step / cfg.warmup_steps)


def autocast_context(kind: str):
    """bf16 autocast on the CPU (kind "bf16") or nothing (kind "none")."""
    if kind == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def average_snapshots(model: torch.nn.Module, paths: list[Path]) -> None:
    """Set model's parameters to the mean of the safetensors weights at `paths` (Vaswani et al. 2017,
    §6.1: the base model averages the last 5 checkpoints)."""
    total = None
    for p in paths:
        load_weights(model, p)
        sd = {k: v.detach().clone().double() for k, v in model.state_dict().items()}
        total = sd if total is None else {k: total[k] + sd[k] for k in total}
    model.load_state_dict({k: (v / len(paths)).float() for k, v in total.items()})


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class Trainer:
    """Trains `model` on `task` under `cfg`, writing into run directory `out`.

    Args:
        model: the module to train. task: see the module docstring. cfg: TrainConfig.
        out: run directory (holds model.safetensors = best weights, metrics.jsonl, checkpoint/).
        d_model: model width, for the Noam schedule.
    """

    def __init__(self, model: torch.nn.Module, task, cfg: TrainConfig, out: Path, d_model: int):
        self.model, self.task, self.cfg, self.out, self.d_model = model, task, cfg, Path(out), d_model
        self.optimizer = build_optimizer(model, 0.0, (cfg.beta1, cfg.beta2), cfg.eps, cfg.weight_decay)
        self._interrupted = False
        self.state = {"step": 0, "epoch": 0, "position": 0, "elapsed_s": 0.0, "tokens": 0,
                      "best": None, "best_step": None, "last_eval": None}

    def log(self, record: dict) -> None:
        with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def resume(self) -> None:
        """Continue from the run directory's checkpoint (weights, optimiser, step, data position, RNG)."""
        self.state = load_training_state(self.out / CHECKPOINT_DIR, self.model, self.optimizer)
        self.state.pop("optimizer", None)

    def checkpoint(self) -> None:
        save_training_state(self.out / CHECKPOINT_DIR, self.model, self.optimizer, self.state)

    def elapsed(self) -> float:
        """Seconds of training so far, across resumes."""
        return self.state["elapsed_s"] + time.perf_counter() - self._clock

    def _budget_left(self) -> bool:
        s, cfg = self.state, self.cfg
        if cfg.max_steps is not None and s["step"] >= cfg.max_steps:
            return False
        return cfg.minutes is None or self.elapsed() < cfg.minutes * 60

    def _evaluate(self, **extra) -> dict:
        """Validate, log the record (with `extra` fields) and keep the weights if they are the best."""
        self.model.eval()
        with torch.no_grad(), autocast_context(self.cfg.autocast):
            metrics = self.task.evaluate(self.model)
        self.model.train()
        s = self.state
        value = metrics[self.task.best_metric]
        sign = 1 if getattr(self.task, "higher_is_better", True) else -1
        improved = s["best"] is None or sign * value > sign * s["best"]
        if improved:
            s["best"], s["best_step"] = value, s["step"]
            save_weights(self.model, self.out / "model.safetensors")
        record = {"step": s["step"], "epoch": s["epoch"], "elapsed_s": round(self.elapsed(), 1), **metrics,
                  **extra, "best": s["best"]}
        self.log(record)
        s["last_eval"] = record
        return record

    def _snapshot(self) -> None:
        """Keep the weights of the last cfg.average_last checkpoints, for averaging at the end."""
        snaps = self.out / SNAPSHOT_DIR
        snaps.mkdir(exist_ok=True)
        save_weights(self.model, snaps / f"step_{self.state['step']:08d}.safetensors")
        for old in sorted(snaps.glob("step_*.safetensors"))[:-self.cfg.average_last]:
            old.unlink()

    def _train_step(self, micro_batches: list) -> tuple[float, int]:
        """One optimizer step over cfg.grad_accum_steps micro-batches.

        The step's loss is Σ (token losses) / Σ (tokens) over the whole accumulation window, each
        micro-batch weighted by the count its objective reports (target tokens, masked tokens,
        sentences or images), so the gradient equals the gradient of the same examples as one
        batch. Each micro-batch's mean loss is back-propagated times its count, and the summed
        gradient is divided by the window's count before clipping (the fault of
        huggingface/transformers#24725: averaging per-micro-batch means weighs a short micro-batch's
        tokens more).

        Returns:
            (the window's mean loss per counted item, the count).
        Raises:
            FloatingPointError: when a loss is not finite (nothing is updated).
        """
        s, cfg = self.state, self.cfg
        lr = learning_rate(cfg, s["step"] + 1, self.d_model)
        set_lr(self.optimizer, lr)
        self.optimizer.zero_grad(set_to_none=True)
        total, n_tokens = 0.0, 0
        for batch in micro_batches:
            with autocast_context(cfg.autocast):
                loss, n = self.task.loss(self.model, batch)
            if not torch.isfinite(loss):
                self.optimizer.zero_grad(set_to_none=True)
                raise FloatingPointError(
                    f"the loss is {loss.item()} at step {s['step'] + 1}: training diverged (lower lr_factor / lr "
                    f"or raise warmup_steps); the weights were not updated and the last checkpoint is intact")
            (loss * n).backward()
            total += loss.item() * n
            n_tokens += n
        scale = 1.0 / max(n_tokens, 1)
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.mul_(scale)
        if cfg.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_grad_norm)
        self.optimizer.step()
        s["step"] += 1
        s["tokens"] += n_tokens
        return total * scale, n_tokens

    def fit(self) -> dict:
        """Train until a budget (cfg.max_steps, cfg.minutes) runs out, then evaluate, checkpoint and
        (cfg.average_last) try the average of the last snapshots. Ctrl-C finishes the current step and
        writes a checkpoint, then raises KeyboardInterrupt; a second Ctrl-C aborts at once.

        Returns:
            the final evaluation record, with "best" and "best_step".
        """
        cfg, s = self.cfg, self.state
        self.out.mkdir(parents=True, exist_ok=True)
        self.model.train()
        self._clock = time.perf_counter()
        if not self._budget_left() and s["last_eval"] is not None:  # a finished run, resumed
            log.info("the run already finished at step %d (%.0f s); raise --steps or --minutes to train longer",
                     s["step"], s["elapsed_s"])
            return {**s["last_eval"], "best": s["best"], "best_step": s["best_step"]}
        window_t, window_tok, last_eval = time.perf_counter(), 0, s["step"]
        bar = tqdm(total=cfg.max_steps, initial=s["step"], unit="step", dynamic_ncols=True, leave=False,
                   mininterval=2.0)
        self._interrupted = False
        previous = signal.signal(signal.SIGINT, self._on_interrupt) if _main_thread() else None
        try:
            while self._budget_left():
                batches = self.task.batches(s["epoch"])
                while s["position"] < len(batches) and self._budget_left():
                    group = batches[s["position"]:s["position"] + cfg.grad_accum_steps]
                    loss, n = self._train_step(group)
                    s["position"] += len(group)
                    if self._interrupted:  # Ctrl-C: the step is complete, so the checkpoint is exact
                        raise KeyboardInterrupt
                    window_tok += n
                    bar.update(1)
                    if s["step"] % cfg.log_every == 0:
                        now = time.perf_counter()
                        tps = window_tok / max(now - window_t, 1e-9)
                        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{self.optimizer.param_groups[0]['lr']:.2e}",
                                        tok_s=f"{tps:.0f}")
                        self.log({"step": s["step"], "epoch": s["epoch"], "loss": round(loss, 4),
                                  "lr": self.optimizer.param_groups[0]["lr"], "tokens_per_s": round(tps, 1),
                                  "elapsed_s": round(self.elapsed(), 1)})
                        window_t, window_tok = now, 0
                    if s["step"] % cfg.eval_every == 0:
                        record = self._evaluate()
                        last_eval = s["step"]
                        bar.write(json.dumps(record), file=sys.stderr)
                        window_t, window_tok = time.perf_counter(), 0  # keep eval time out of tokens/s
                    if s["step"] % cfg.checkpoint_every == 0:
                        self._save()
                        if cfg.average_last:
                            self._snapshot()
                if s["position"] >= len(batches):
                    s["epoch"], s["position"] = s["epoch"] + 1, 0
        except KeyboardInterrupt:
            self._save()
            raise
        finally:
            bar.close()
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        record = self._evaluate() if last_eval != s["step"] or s["last_eval"] is None else s["last_eval"]
        self._save()
        if cfg.average_last:
            self._snapshot()
        record = self._try_average() or record
        return {**record, "best": s["best"], "best_step": s["best_step"]}

    def _on_interrupt(self, signum, frame) -> None:
        if self._interrupted:  # a second Ctrl-C stops at once (the last checkpoint stays valid)
            raise KeyboardInterrupt
        self._interrupted = True
        tqdm.write("interrupted: finishing this step and writing a checkpoint (Ctrl-C again to abort)")

    def _save(self) -> None:
        self.state["elapsed_s"] = self.elapsed()
        self._clock = time.perf_counter()
        self.checkpoint()

    def _try_average(self) -> dict | None:
        snaps = sorted((self.out / SNAPSHOT_DIR).glob("step_*.safetensors")) if self.cfg.average_last else []
        if len(snaps) < 2:
            return None
        average_snapshots(self.model, snaps)
        record = self._evaluate(averaged=[p.stem for p in snaps])
        load_training_state(self.out / CHECKPOINT_DIR, self.model, self.optimizer)  # back to the last weights
        return record
