r"""Pre-tokenization for byte-level BPE: the split regexes and the byte <-> unicode alphabet.

Byte-level BPE (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners",
section 2.2) first cuts text into pre-tokens with a regex, so that merges never cross a word,
number or punctuation boundary, then runs BPE (Sennrich et al. 2016, "Neural Machine Translation
of Rare Words with Subword Units") on the UTF-8 bytes of each pre-token.

Patterns (selected by name):
    "gpt2": the GPT-2 pattern (Radford et al. 2019): contractions, optional space + letters,
            optional space + digits, optional space + other symbols, whitespace runs.
    "gpt4": the cl100k_base style pattern (GPT-4; also LLaMA-3): case-insensitive contractions,
            letters with one leading non-letter, digits in groups of at most 3, newline handling.

Unicode version: \p{L} / \p{N} follow the `regex` module's Unicode tables. Hugging Face
`tokenizers` uses Oniguruma's (older) tables, so pre-tokens can differ on characters assigned only
in recent Unicode versions (checked: none of the characters assigned by Unicode 14 differ).

The byte <-> unicode table is GPT-2's: each of the 256 byte values maps to one printable
character, so a token's bytes can be written as a string in a `tokenizer.json` vocab
(this is what the Hugging Face `ByteLevel` pre-tokenizer and decoder use).
"""
from __future__ import annotations

import functools
from typing import Iterable

import regex

from attnlab.errors import UserError

GPT2_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)
GPT4_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
PATTERNS: dict[str, str] = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN}
# StarCoder / SmolLM: HF `Sequence[Digits(individual_digits=true), ByteLevel(use_regex=true)]`,
# i.e. every \p{N} character alone, then the GPT-2 regex on each stretch between digits. One regex
# does both: a lone \p{N} first; " ?\p{N}+" dropped (a space never joins a digit); and a
# whitespace run may also end before a digit, the end of its stretch ((?!\S) -> (?![^\s\p{N}])).
DIGITS_GPT2_PATTERN = (
    r"""\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"""
)


def resolve_pattern(name: str) -> str:
    """Return the regex source of a named pre-tokenization pattern.

    Args:
        name: "gpt2" or "gpt4".
    Returns:
        The regex source string (syntax shared by the `regex` module and Oniguruma).
    Raises:
        ValueError: if `name` is not a known pattern name.
    Source: GPT-2 pattern from Radford et al. 2019; "gpt4" is the cl100k_base pattern.
    """
    try:
        return PATTERNS[name]
    except (KeyError, TypeError):
        raise UserError(f"pattern must be one of {sorted(PATTERNS)}, got {name!r}") from None


def pattern_name(source: str) -> str:
    """Return "gpt2" / "gpt4" when `source` is one of the known regexes, else "custom"."""
    for name, known in PATTERNS.items():
        if source == known:
            return name
    return "custom"


@functools.lru_cache(maxsize=32)
def compile_pattern(source: str) -> regex.Pattern:
    """Compile a pre-tokenization regex (cached).

    Raises:
        ValueError: if `source` is not a valid regex for the `regex` module.
    """
    try:
        return regex.compile(source)
    except regex.error as err:
        raise UserError(f"invalid pre-tokenization regex {source!r}: {err}") from None


def split_isolated(compiled: regex.Pattern, text: str) -> list[str]:
    """Cut `text` into pre-tokens: every regex match, plus any unmatched gap, in order.

    This is Hugging Face's Split(behavior="Isolated") semantics. The GPT-2 and GPT-4 patterns
    match every character, so for them it equals `compiled.findall(text)` (the fast path).

    Args:
        compiled: a compiled pre-tokenization pattern.
        text: any string.
    Returns:
        Non-empty strings whose concatenation is `text`.
    """
    pieces = compiled.findall(text)
    if sum(map(len, pieces)) == len(text):
        return pieces
    pieces, end = [], 0
    for match in compiled.finditer(text):
        if match.start() > end:
            pieces.append(text[end:match.start()])
        if match.end() > match.start():
            pieces.append(match.group())
        end = match.end()
    if end < len(text):
        pieces.append(text[end:])
    return pieces


def specials_regex(specials: Iterable[str]) -> regex.Pattern:
    """A regex with one capturing group matching any of `specials` literally, longest first.

    `pattern.split(text)` then alternates text (even indices) and special tokens (odd indices);
    at each position the longest special token wins, as in HF's added-token matching.
    """
    alternatives = sorted(specials, key=lambda s: (-len(s), s))
    return regex.compile("(" + "|".join(regex.escape(s) for s in alternatives) + ")")


def pretokenize(text: str, pattern: str = "gpt2") -> list[str]:
    """Split `text` into pre-tokens with a named pattern.

    Args:
        text: any string.
        pattern: "gpt2" or "gpt4".
    Returns:
        The pre-tokens; their concatenation is `text`. E.g. gpt2: "a  b" -> ["a", " ", " b"].
    Raises:
        ValueError: unknown pattern name.
    Source: Radford et al. 2019, section 2.2.
    """
    return split_isolated(compile_pattern(resolve_pattern(pattern)), text)


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte value (0..255) to one printable character.

    Bytes that are printable Latin-1 ('!'..'~', '¡'..'¬', '®'..'ÿ') map to themselves; the other
    68 bytes map, in increasing byte order, to chr(256), chr(257), ... (so b" " -> "Ġ").
    Source: Radford et al. 2019 (GPT-2 released encoder); used by HF ByteLevel.
    """
    printable = set(range(ord("!"), ord("~") + 1))
    printable |= set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), ord("ÿ") + 1))
    mapping, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(256 + extra)
            extra += 1
    return mapping


@functools.lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """Inverse of `bytes_to_unicode`: character -> byte value."""
    return {char: byte for byte, char in bytes_to_unicode().items()}


def token_to_unicode(token: bytes) -> str:
    """Write a token's bytes as its byte-level string (the `tokenizer.json` vocab spelling)."""
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


def unicode_to_token(text: str) -> bytes:
    """Inverse of `token_to_unicode`.

    Raises:
        ValueError: if `text` has a character outside the 256-character byte-level alphabet.
    """
    table = unicode_to_bytes()
    try:
        return bytes(table[char] for char in text)
    except KeyError as err:
        raise UserError(f"{text!r} has character {err.args[0]!r} outside the byte-level "
                        "alphabet") from None
