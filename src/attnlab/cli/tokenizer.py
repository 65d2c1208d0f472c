"""`attnlab tokenizer train|encode|decode|viz`: argparse sub-commands over the tokenizer API.

    attnlab tokenizer train --input FILE... --vocab-size N --out tokenizer.json
                            [--pattern gpt2|gpt4] [--special TOKEN ...] [--min-frequency N]
    attnlab tokenizer encode --tokenizer PATH [--allow-special] [TEXT]
    attnlab tokenizer decode --tokenizer PATH [--skip-special]
    attnlab tokenizer viz [--words "low lower newest widest newer wider"] [--merges N]
                          [--out FILE.png]

PATH is a `tokenizer.json`, a directory holding one, or a `.gguf` file. `encode` prints one JSON
list of ids for TEXT, or one per stdin line; `decode` reads one JSON list of ids per stdin line
and prints its text. Input files and stdin must be UTF-8: invalid bytes raise ValueError naming
the byte offset (no replacement). Errors are ValueError / FileNotFoundError with a one-line
message; `attnlab.cli.main` turns them into exit code 2.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from attnlab.cli.args import decode_utf8, stdin_lines
from attnlab.errors import UserError
from attnlab.tokenizers.bpe import ByteLevelBPE, load_tokenizer
from attnlab.tokenizers.gguf import read_gguf_tokenizer
from attnlab.tokenizers.pretokenize import PATTERNS
from attnlab.tokenizers.viz import draw_trace, format_trace, merge_steps

DEFAULT_WORDS = "low lower newest widest newer wider"


def add_tokenizer_parser(subparsers) -> None:
    """Add `tokenizer` with its sub-commands to the main parser's sub-parsers."""
    p = subparsers.add_parser("tokenizer", help="byte-level BPE: train, encode, decode, viz")
    sub = p.add_subparsers(dest="tokenizer_command", required=True)

    t = sub.add_parser("train", help="train a byte-level BPE tokenizer on text files")
    t.add_argument("--input", nargs="+", required=True, metavar="FILE", help="UTF-8 text files")
    t.add_argument("--vocab-size", type=int, required=True,
                   help="total vocabulary size (>= 256 + number of special tokens)")
    t.add_argument("--out", required=True, help="tokenizer.json to write (or a directory)")
    t.add_argument("--pattern", choices=sorted(PATTERNS), default="gpt2",
                   help="pre-tokenization regex (default gpt2)")
    t.add_argument("--special", nargs="+", action="extend", default=[], metavar="TOKEN",
                   help="special tokens, given ids 0, 1, ... in this order")
    t.add_argument("--min-frequency", type=int, default=2,
                   help="stop when the best pair occurs fewer times (default 2)")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("encode", help="print a JSON list of ids for TEXT (or per stdin line)")
    e.add_argument("--tokenizer", required=True, metavar="PATH",
                   help="tokenizer.json, its directory, or a .gguf file")
    e.add_argument("--allow-special", action="store_true",
                   help="match special tokens in the text as whole units (default: plain text)")
    e.add_argument("text", nargs="?", help="text to encode (default: each stdin line)")
    e.set_defaults(func=cmd_encode)

    d = sub.add_parser("decode", help="read a JSON list of ids per stdin line, print its text")
    d.add_argument("--tokenizer", required=True, metavar="PATH",
                   help="tokenizer.json, its directory, or a .gguf file")
    d.add_argument("--skip-special", action="store_true", help="drop special tokens")
    d.set_defaults(func=cmd_decode)

    v = sub.add_parser("viz", help="show BPE merges step by step on a word list")
    v.add_argument("--words", default=DEFAULT_WORDS, help=f'default "{DEFAULT_WORDS}"')
    v.add_argument("--merges", type=int, default=10, help="number of merges (default 10)")
    v.add_argument("--out", help="also draw the steps to this image file (matplotlib)")
    v.set_defaults(func=cmd_viz)


def load_any(path) -> ByteLevelBPE:
    """A tokenizer from `tokenizer.json`, a directory holding one, or a `.gguf` file.

    Raises:
        FileNotFoundError: no such file. ValueError: malformed file, or `gguf` not installed.
    """
    if str(path).lower().endswith(".gguf"):
        try:
            return read_gguf_tokenizer(path).tokenizer
        except ImportError as err:  # the optional `gguf` package: a one-line reason, exit 2
            raise UserError(str(err)) from None
    return load_tokenizer(path)


def read_text_file(path) -> str:
    """Read a UTF-8 text file. Raises FileNotFoundError / ValueError (with the byte offset)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    return decode_utf8(path.read_bytes(), str(path))


def lines_with_ends(text: str) -> list[str]:
    """`text` cut after every "\n" (kept), as HF `tokenizers` reads training files."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def cmd_train(args) -> None:
    """Train on the files (each line, with its newline, is one text); write tokenizer.json."""
    texts: list[str] = []
    for name in args.input:
        texts.extend(lines_with_ends(read_text_file(name)))
    start = time.perf_counter()
    tok = ByteLevelBPE.train(texts, args.vocab_size, args.special, pattern=args.pattern,
                             min_frequency=args.min_frequency)
    seconds = time.perf_counter() - start
    tok.save(args.out)
    print(f"trained {tok.vocab_size} tokens ({len(tok.merges)} merges) in {seconds:.1f} s",
          file=sys.stderr)
    print(json.dumps({"out": str(args.out), "vocab_size": tok.vocab_size,
                      "merges": len(tok.merges), "seconds": round(seconds, 3)}))


def cmd_encode(args) -> None:
    tok = load_any(args.tokenizer)
    allowed = "all" if args.allow_special else "none"
    lines = [args.text] if args.text is not None else stdin_lines()
    for line in lines:
        print(json.dumps(tok.encode(line, allowed_special=allowed)), flush=True)


def cmd_decode(args) -> None:
    tok = load_any(args.tokenizer)
    for n, line in enumerate(stdin_lines(), 1):
        if not line.strip():
            continue
        try:
            ids = json.loads(line)
        except json.JSONDecodeError:
            ids = None
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise UserError(f"stdin line {n}: expected a JSON list of token ids, got "
                            f"{line[:60]!r}")
        print(tok.decode(ids, skip_special=args.skip_special), flush=True)


def cmd_viz(args) -> None:
    trace = merge_steps(args.words, args.merges)
    print(format_trace(trace))
    if len(trace.steps) < args.merges:
        print(f"stopped after {len(trace.steps)} merges: no adjacent pair left", file=sys.stderr)
    if args.out:
        draw_trace(trace, args.out)
        print(f"wrote {args.out}", file=sys.stderr)
