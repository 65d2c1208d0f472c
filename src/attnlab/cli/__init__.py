"""The `attnlab` command line: argparse sub-commands, each a thin call into one library function.

One module per group of sub-commands (training.py: train, evaluate; models.py: translate,
generate, chat, embed, classify, convert; serve.py: serve; tokenizer.py: tokenizer ...; viz/cli.py: viz ...), shared
validators and text
input in args.py. Machine-readable output goes to stdout (JSON where stated), progress and logs to
stderr. Exit code 0 on success, 2 on bad input with a one-line reason: the library's UserError
(errors.py) and OSError (a missing or unusable file), with the parameter the library names written
as this command's flag. Any other exception is a bug: its traceback is printed (exit code 1).
"""
from __future__ import annotations

import argparse
import logging
import re
import sys

from attnlab.cli.args import OneLineParser, flags_of
from attnlab.cli.models import add_model_parsers
from attnlab.cli.serve import add_serve_parser
from attnlab.cli.tokenizer import add_tokenizer_parser
from attnlab.cli.training import add_training_parsers
from attnlab.errors import UserError
from attnlab.viz.cli import add_viz_parser


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="attnlab", description="The Transformer family: train, run, inspect.")
    sub = p.add_subparsers(dest="command", required=True)
    add_training_parsers(sub)
    add_model_parsers(sub)
    add_serve_parser(sub)
    add_tokenizer_parser(sub)
    add_viz_parser(sub)
    return p


def error_line(error: BaseException, flags: dict[str, tuple[str, bool]]) -> str:
    """The one-line message of a bad-input error: its text, with each parameter it names as
    `name=value` (its `params`, errors.UserError) written as this command's flag: "dtype='q2'" ->
    "--dtype 'q2'", "resume=True" -> "--resume" (a switch)."""
    text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    for name in getattr(error, "params", ()):
        if name in flags:
            flag, switch = flags[name]
            text = re.sub(rf"(?<![\w./-]){re.escape(name)}=(True\b)?",
                          lambda m: flag if m.group(1) and switch else f"{flag} {m.group(1) or ''}", text)
    return text


def main(argv: list[str] | None = None) -> int:
    """Run the `attnlab` command line on `argv` (default: sys.argv[1:]); returns the exit code."""
    args = build_parser().parse_args(argv)
    # our progress lines at INFO; other libraries' (gguf's "Writing the following files", ...) only from WARNING
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("attnlab").setLevel(logging.INFO)
    try:
        args.func(args)
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (e.g. `| head`): stop quietly
        sys.stderr.close()
        return 0
    except (UserError, OSError) as e:  # bad input: one line, no traceback (anything else is a bug)
        print(f"attnlab: error: {error_line(e, flags_of(args))}", file=sys.stderr)
        return 2
    return 0
