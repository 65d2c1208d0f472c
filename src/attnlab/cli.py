"""The `attnlab` command line: argparse sub-commands, each a thin call into one library function.

Machine-readable output goes to stdout (JSON where stated), progress and logs to stderr.
Exit code 0 on success, 2 on bad input with a one-line reason.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys


def _cmd_train(args) -> None:
    from attnlab.recipes import get_recipe

    recipe = get_recipe(args.recipe)
    budget = []
    if args.minutes is not None:
        budget.append(f"minutes={args.minutes}")
    if args.steps is not None:
        budget += [f"max_steps={args.steps}"] + ([] if args.minutes is not None else ["minutes=none"])
    if args.resume and args.set:
        raise ValueError("--set cannot change a run being resumed (its settings are in its config.json); "
                         "only --steps and --minutes apply")
    recipe = recipe.with_overrides(list(args.set) + budget)
    out = args.out or f"runs/{recipe.name}"
    try:
        result = _trainer(recipe.kind)(recipe, out, resume=args.resume)
    except KeyboardInterrupt:
        print(f"attnlab: interrupted; continue with: attnlab train --recipe {recipe.name} --out {out} --resume",
              file=sys.stderr)
        raise SystemExit(130) from None
    print(json.dumps(result))


def _trainer(kind: str):
    """The library function that trains a recipe of this kind."""
    if kind == "language-model":
        from attnlab.lm import train_lm
        return train_lm
    if kind == "bert":
        from attnlab.text_classification import train_bert
        return train_bert
    if kind == "vit":
        from attnlab.vision import train_vit
        return train_vit
    from attnlab.translation import train_translation
    return train_translation


def _cmd_evaluate(args) -> None:
    from pathlib import Path

    from attnlab.runs import model_type

    kind = model_type(Path(args.model))
    if kind == "gpt":
        from attnlab.lm import evaluate_lm
        print(json.dumps(evaluate_lm(args.model, args.split, args.limit)))
        return
    if kind == "bert":
        from attnlab.text_classification import evaluate_bert
        print(json.dumps(evaluate_bert(args.model, args.split, args.limit)))
        return
    if kind == "vit":
        from attnlab.vision import evaluate_vit
        print(json.dumps(evaluate_vit(args.model, args.split, args.limit)))
        return
    from attnlab.translation import evaluate_translation
    print(json.dumps(evaluate_translation(args.model, args.split, args.limit, args.beam)))


def _cmd_translate(args) -> None:
    from attnlab.translation import load_translator, translate

    lines = [_check_text(t, f"argument {i + 1}") for i, t in enumerate(args.text)] if args.text else _stdin_lines()
    model, tokenizer, _ = load_translator(args.model)
    todo = [i for i, x in enumerate(lines) if x.strip()]  # empty lines are skipped (an empty line out)
    out = [""] * len(lines)
    for i, hyp in zip(todo, translate(model, tokenizer, [lines[i].strip() for i in todo], args.beam)):
        out[i] = hyp
    for hyp in out:
        print(hyp, flush=True)


def _check_text(text: str, where: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # undecodable bytes in argv arrive as surrogates
        raise ValueError(f"{where} is not valid UTF-8 (character {e.start})") from None
    return text


def _stdin_lines() -> list[str]:
    """Standard input as lines; bytes that are not UTF-8 are refused with the line and byte offset."""
    lines = []
    for n, raw in enumerate(sys.stdin.buffer.read().splitlines(), 1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ValueError(f"stdin line {n} is not valid UTF-8 (byte offset {e.start})") from None
    return lines


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _nonnegative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _probability(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def _beam(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be in 1..64 (1 = greedy), got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="attnlab", description="The Transformer family: train, run, inspect.")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a recipe into a run directory")
    t.add_argument("--recipe", required=True, help="recipe name: multi30k-en-de, shakespeare-char, "
                   "shakespeare-char-llama, shakespeare-bpe, bert-mlm, sst2, sst2-minilm, mnist-vit, digits-vit")
    t.add_argument("--minutes", type=_positive_float, help="wall-clock budget (total, across resumes)")
    t.add_argument("--steps", type=_positive_int, help="optimizer-step budget (total, across resumes)")
    t.add_argument("--out", help="run directory (default runs/RECIPE)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model/data/train setting, e.g. --set d_model=512")
    t.set_defaults(func=_cmd_train)

    e = sub.add_parser("evaluate", help="score a trained model (sacreBLEU for translation, validation loss and "
                       "perplexity for language models); one JSON line on stdout")
    e.add_argument("--model", required=True, help="trained model directory")
    e.add_argument("--split", default="test", help="train | val | test (translation: test = test_2016_flickr; "
                   "language models: test = val, the held-out 10%%)")
    e.add_argument("--limit", type=_positive_int, help="only the first N sentences (translation) or tokens (LM)")
    e.add_argument("--beam", type=_beam, default=4, help="translation beam size 1..64 (1 = greedy; default 4)")
    e.set_defaults(func=_cmd_evaluate)

    tr = sub.add_parser("translate", help="translate TEXT arguments, or stdin lines; one line out each "
                        "(an empty line in gives an empty line out)")
    tr.add_argument("--model", required=True, help="trained model directory")
    tr.add_argument("--beam", type=_beam, default=4, help="beam size 1..64 (1 = greedy; default 4)")
    tr.add_argument("text", nargs="*", help="sentences to translate (default: read stdin)")
    tr.set_defaults(func=_cmd_translate)
    from attnlab.cli_models import add_model_parsers
    add_model_parsers(sub)
    from attnlab.tokenizers.cli import add_tokenizer_parser
    add_tokenizer_parser(sub)
    from attnlab.viz.cli import add_viz_parser
    add_viz_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        args.func(args)
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (e.g. `| head`): stop quietly
        sys.stderr.close()
        return 0
    except (ValueError, KeyError, OSError, ArithmeticError) as e:  # bad input: one line, no traceback
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"attnlab: error: {msg}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
