"""The training state (TrainState, written as checkpoint/state.json): its fields, the defaults older
checkpoints lack, and its validation on load — types and ranges, one line naming the file and the
field. The JSON object on disk has one key per field, as it always had.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from attnlab.errors import UserError

END_STAGES = (None, "evaluated", "done")


@dataclass
class TrainState:
    """Where a run is; the default is a run before its first step."""

    step: int = 0                  # optimizer steps done
    epoch: int = 0                 # the data epoch ...
    position: int = 0              # ... and the index of its next batch
    elapsed_s: float = 0.0         # training seconds so far, across resumes
    tokens: int = 0                # counted tokens (or sentences, images) so far
    best: Optional[float] = None   # the best validation metric (None before the first evaluation) ...
    best_step: Optional[int] = None  # ... and its step; the checkpoint's best.safetensors holds those weights
    last_eval: Optional[dict] = None  # the last evaluation record (None before the first)
    snapshots: Optional[list] = field(default_factory=list)  # steps whose weights snapshots/ keeps for the
                                   # final average (TrainConfig.average_last); None: an older checkpoint's,
                                   # taken from the files (run_dir.align_with_checkpoint)
    metrics_bytes: Optional[int] = 0  # metrics.jsonl's length at this checkpoint (a resume cuts what came
                                   # after); None: an older checkpoint's, metrics.jsonl is kept whole
    end: Optional[str] = None      # the end-of-run stage reached (END_STAGES): None (training), "evaluated"
                                   # (final evaluation and checkpoint done), "done" (the run is finished)
    optimizer: Optional[dict] = None  # read from disk only: {"param_groups", "n_states"}, the optimizer's
                                   # settings per group (the checkpoint writes them from the optimizer)

    def to_json(self) -> dict:
        """state.json's object, without "optimizer" (checkpoint.save_training_state adds it)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "optimizer"}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _check(ok: bool, path: Path, field: str, allowed: str, value) -> None:
    if not ok:
        raise UserError(f"{path}: {field} must be {allowed}, got {value!r}")


def validate_state(state: dict, path: Path) -> TrainState:
    """state.json's content checked and completed with the defaults of older checkpoints
    (snapshots None: taken from the files; metrics_bytes None: metrics.jsonl is kept whole; end:
    "done" when the last evaluation is of the last step). Keys no field has are ignored.

    Raises:
        UserError: naming `path` and the field that is missing, of the wrong type or out of range.
    """
    missing = [k for k in ("step", "epoch", "position", "tokens", "elapsed_s", "optimizer") if k not in state]
    if missing:
        raise UserError(f"{path}: missing field(s) {missing}; the checkpoint is damaged")
    for name in ("step", "epoch", "position", "tokens"):
        _check(_is_int(state[name]) and state[name] >= 0, path, name, "an int >= 0", state[name])
    step = state["step"]
    _check(_is_number(state.get("elapsed_s")) and state["elapsed_s"] >= 0, path, "elapsed_s", "a number >= 0",
           state.get("elapsed_s"))
    best, best_step = state.get("best"), state.get("best_step")
    _check(best is None or _is_number(best), path, "best", "null or a finite number", best)
    _check((best is None) == (best_step is None), path, "best_step", "null exactly when best is", best_step)
    _check(best_step is None or (_is_int(best_step) and 0 <= best_step <= step), path, "best_step",
           f"null or an int in 0..step={step}", best_step)
    last = state.get("last_eval")
    _check(last is None or (isinstance(last, dict) and _is_int(last.get("step")) and 0 <= last["step"] <= step),
           path, "last_eval", f"null or a record with a step in 0..{step}", last)
    snaps = state.get("snapshots")
    _check(snaps is None or (isinstance(snaps, list) and all(_is_int(s) and 0 <= s <= step for s in snaps)
                             and snaps == sorted(set(snaps))), path, "snapshots",
           f"a list of increasing steps in 0..{step}", snaps)
    size = state.get("metrics_bytes")
    _check(size is None or (_is_int(size) and size >= 0), path, "metrics_bytes", "an int >= 0", size)
    if "end" not in state:  # a checkpoint from before the end-of-run stages were recorded
        state["end"] = "done" if last is not None and last["step"] == step else None
    _check(state["end"] in END_STAGES, path, "end", f"one of {END_STAGES}", state["end"])
    opt = state.get("optimizer")
    _check(isinstance(opt, dict) and isinstance(opt.get("param_groups"), list) and _is_int(opt.get("n_states"))
           and all(isinstance(g, dict) and isinstance(g.get("params"), list) and all(map(_is_int, g["params"]))
                   for g in opt["param_groups"]), path, "optimizer",
           'an object with "param_groups" (each with its "params") and "n_states"', opt)
    known = {f.name for f in dataclasses.fields(TrainState)}
    return TrainState(**{"snapshots": None, "metrics_bytes": None, **{k: v for k, v in state.items() if k in known}})


def check_param_groups(saved: list[dict], current: list[dict], path: Path) -> None:
    """The saved optimizer groups must match the optimizer being resumed: as many groups, the same
    parameters in each, and settings of the same kinds (numbers finite).

    Raises:
        ValueError: naming `path` and the group's setting.
    """
    _check(len(saved) == len(current), path, "optimizer.param_groups", f"{len(current)} groups (this model's)",
           f"{len(saved)} groups")
    for i, (s, c) in enumerate(zip(saved, current)):
        for key, now in c.items():
            field, value = f"optimizer.param_groups[{i}].{key}", s.get(key)
            if key == "params":
                _check(value == now, path, field, f"{len(now)} parameters {now[:3]}...", value)
            elif isinstance(now, bool) or now is None:
                _check(value is None or isinstance(value, bool), path, field, "null or a bool", value)
            elif isinstance(now, (int, float)):
                _check(_is_number(value), path, field, "a finite number", value)
            elif isinstance(now, (tuple, list)):
                _check(isinstance(value, list) and len(value) == len(now) and all(map(_is_number, value)),
                       path, field, f"a list of {len(now)} finite numbers", value)
