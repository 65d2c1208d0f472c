"""`attnlab train` and `attnlab evaluate`: thin calls into the task registry (tasks/registry.py).
Under torchrun each process runs `train` (train/distributed.py); `train --nproc N` starts them
(train/launch.py)."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from attnlab.cli.args import beam, nonnegative_float, positive_float, positive_int
from attnlab.errors import UserError
from attnlab.files import DiskFullError
from attnlab.nn.quant_linear import FLOAT_DTYPES
from attnlab.nn.quant import SCHEMES
from attnlab.recipes import RECIPES, get_recipe
from attnlab.tasks.registry import evaluate_run, task_of_recipe
from attnlab.train.distributed import process_group
from attnlab.train.launch import launch
from attnlab.train.run_dir import has_checkpoint


def continue_command(recipe, out: str) -> str:
    """The command that continues run `out` to the same result: --resume with the run's budget."""
    budget = "".join(f" --{flag} {value:g}" for flag, value in (("minutes", recipe.train.minutes),
                                                               ("steps", recipe.train.max_steps)) if value is not None)
    return f"attnlab train --recipe {recipe.name} --out {out} --resume{budget}"


def train_argv(args) -> list[str]:
    """The `attnlab train` arguments of `args` without --nproc (what each launched process runs)."""
    argv = ["train", "--recipe", args.recipe]
    for flag, value in (("--minutes", args.minutes), ("--steps", args.steps), ("--out", args.out)):
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--resume"] if args.resume else []
    for assignment in args.set:
        argv += ["--set", assignment]
    return argv


def cmd_train(args) -> None:
    if args.nproc is not None:
        if "WORLD_SIZE" in os.environ:
            raise UserError("--nproc starts the processes itself; under torchrun leave it out")
        get_recipe(args.recipe).with_overrides(list(args.set))  # bad input: one line here, not one per process
        code = launch(args.nproc, train_argv(args))
        if code:
            raise SystemExit(code)
        return
    recipe = get_recipe(args.recipe)
    budget = []
    if args.minutes is not None:
        budget.append(f"minutes={args.minutes}")
    if args.steps is not None:
        budget += [f"max_steps={args.steps}"] + ([] if args.minutes is not None else ["minutes=none"])
    if args.resume and args.set:
        raise UserError("--set cannot change a run being resumed (its settings are in its config.json); "
                        "only --steps and --minutes apply")
    recipe = recipe.with_overrides(list(args.set) + budget)
    out = args.out or f"runs/{recipe.name}"
    try:
        with process_group() as world:
            result = task_of_recipe(recipe).train(recipe, out, resume=args.resume)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (train/guards.py): a checkpoint was written
        then = f"continue with: {continue_command(recipe, out)}" if has_checkpoint(Path(out)) else \
            "nothing to resume yet"
        print(f"attnlab: interrupted; {then}", file=sys.stderr)
        raise SystemExit(128 + getattr(e, "signum", signal.SIGINT)) from None
    except DiskFullError as e:
        if not has_checkpoint(Path(out)):
            raise
        raise OSError(f"{e.reason}; temporary files were removed and the last checkpoint is intact: free some "
                      f"space, then continue with: {continue_command(recipe, out)}") from None
    if world.is_main:
        print(json.dumps(result))


def cmd_evaluate(args) -> None:
    print(json.dumps(evaluate_run(args.model, args.split, args.limit, beam=args.beam,
                                  length_penalty=args.length_penalty,
                                  dtype=None if args.dtype == "fp32" else args.dtype)))


def add_training_parsers(sub) -> None:
    """Register train and evaluate on the main parser's sub-parsers."""
    t = sub.add_parser("train", help="train a recipe into a run directory")
    t.add_argument("--recipe", required=True, help=f"recipe name: {', '.join(RECIPES)}")
    t.add_argument("--minutes", type=positive_float, help="wall-clock budget (total, across resumes)")
    t.add_argument("--steps", type=positive_int, help="optimizer-step budget (total, across resumes)")
    t.add_argument("--out", help="run directory (default runs/RECIPE)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model/data/train setting, e.g. --set d_model=512 (--set parallel=fsdp)")
    t.add_argument("--nproc", type=positive_int, help="train in N processes on this host (torch.distributed.run; "
                   "same as torchrun --nproc_per_node N -m attnlab train ...)")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("evaluate", help="score a trained model (sacreBLEU for translation, validation loss and "
                       "perplexity for language models, accuracy for classifiers); one JSON line on stdout")
    e.add_argument("--model", required=True, help="trained model directory")
    e.add_argument("--split", help="train | val | test (default: the task's held-out split; translation: test = "
                   "test_2016_flickr; language models: test = val, the held-out 10%%)")
    e.add_argument("--limit", type=positive_int, help="only the first N sentences (translation) or tokens (LM)")
    e.add_argument("--beam", type=beam, help="translation beam size 1..64 (1 = greedy; default: the run's "
                   "beam_size, 4)")
    e.add_argument("--length-penalty", type=nonnegative_float, metavar="ALPHA",
                   help="translation: α of beam search's length penalty (default: the run's length_penalty)")
    e.add_argument("--dtype", choices=(*FLOAT_DTYPES, *SCHEMES), default="fp32",
                   help="language models: score with the weights at fp32 (default), bf16 or a block "
                   "quantization q8_0 / q4_0 / q4_1")
    e.set_defaults(func=cmd_evaluate)
