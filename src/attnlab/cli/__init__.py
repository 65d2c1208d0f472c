"""The `attnlab` command line: argparse sub-commands, each a thin call into one library function.

One module per group of sub-commands (training.py: train, evaluate; models.py: translate,
generate, chat, embed, classify, convert; serve.py: serve; tokenizer.py: tokenizer ...; viz/cli.py: viz ...), shared
validators and text
input in args.py. Machine-readable output goes to stdout (JSON where stated), progress and logs to
stderr. Exit code 0 on success, 2 on bad input with a one-line reason.
"""
from __future__ import annotations

import argparse
import logging
import sys

from attnlab.cli.args import OneLineParser
from attnlab.cli.models import add_model_parsers
from attnlab.cli.serve import add_serve_parser
from attnlab.cli.tokenizer import add_tokenizer_parser
from attnlab.cli.training import add_training_parsers
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
