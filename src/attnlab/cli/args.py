"""What every `attnlab` sub-command shares: the one-line-error parser, argument validators, and
reading text from arguments or standard input (strictly UTF-8, errors naming the position)."""
from __future__ import annotations

import argparse
import sys

from attnlab.errors import UserError


class OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block), exit code 2. The parsed namespace records
    the flags of the (innermost) sub-command that parsed it: flags_of(args)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_known_args(self, args=None, namespace=None):
        namespace = argparse.Namespace() if namespace is None else namespace
        setattr(namespace, _FLAGS, {a.dest: (max(a.option_strings, key=len), a.nargs == 0) for a in self._actions
                                    if a.option_strings and a.dest != "help"})
        return super().parse_known_args(args, namespace)


_FLAGS = "_flags"  # the namespace attribute OneLineParser fills


def flags_of(args: argparse.Namespace) -> dict[str, tuple[str, bool]]:
    """{parameter (the option's dest): (its flag, whether it is a switch)} of the sub-command that
    parsed `args`, e.g. {"source": ("--from", False), "resume": ("--resume", True)}: how the CLI
    names a parameter in an error message."""
    return getattr(args, _FLAGS, {})


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {value}")
    return value


def nonnegative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {value}")
    return value


def probability(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def beam(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be in 1..64 (1 = greedy), got {value}")
    return value


def seed(text: str) -> int:
    value = int(text)
    if not 0 <= value < 2 ** 63:
        raise argparse.ArgumentTypeError(f"must be in 0 .. 2**63 - 1, got {value}")
    return value


def decode_utf8(data: bytes, where: str) -> str:
    """Strict UTF-8 decoding. Raises ValueError naming `where` and the first bad byte offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{where}: not valid UTF-8 at byte offset {err.start} "
                        f"(byte 0x{data[err.start]:02x})") from None


def check_text(text: str, where: str) -> str:
    """`text` itself, refused when argv carried bytes that are not UTF-8 (they arrive as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UserError(f"{where} is not valid UTF-8 (character {e.start})") from None
    return text


def stdin_lines() -> list[str]:
    """Standard input as lines without their line ends ("\\n" or "\\r\\n"); bytes that are not UTF-8 are
    refused with the line number and byte offset."""
    stream = sys.stdin
    raw = stream.buffer.read() if hasattr(stream, "buffer") else stream.read().encode("utf-8")
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [decode_utf8(line[:-1] if line.endswith(b"\r") else line, f"stdin line {n}")
            for n, line in enumerate(lines, 1)]


def texts(arguments: list[str]) -> list[str]:
    """The texts of the arguments, or else of stdin's lines; an empty one is refused by position."""
    where = "argument" if arguments else "stdin line"
    found = [check_text(t, f"argument {i + 1}") for i, t in enumerate(arguments)] if arguments else stdin_lines()
    if not found:
        raise UserError("give at least one text (arguments, or one per stdin line)")
    empty = [i + 1 for i, t in enumerate(found) if not t.strip()]
    if empty:
        raise UserError(f"{where} {empty[0]} is empty; every {where.split()[-1]} must hold some text")
    return found
