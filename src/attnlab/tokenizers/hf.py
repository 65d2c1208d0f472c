"""Hugging Face `tokenizer.json` export/import for byte-level BPE (no dependency on `tokenizers`).

Format: the serialization of the Rust `tokenizers` library (version "1.0"): model type "BPE" with
a vocab of byte-level strings (see pretokenize.bytes_to_unicode) and a merge list; added_tokens;
pre_tokenizer `ByteLevel(use_regex=true)` (the GPT-2 regex) or `Sequence[Split(Regex, "Isolated"),
ByteLevel(use_regex=false)]` (LLaMA-3 / Qwen style, any regex); decoder `ByteLevel`. On import
also `Sequence[Digits(individual_digits=true), ByteLevel(use_regex=true)]` (StarCoder / SmolLM2),
read as one regex (pretokenize.DIGITS_GPT2_PATTERN) and written back as Split + ByteLevel.
Sources: Radford et al. 2019 (byte-level BPE); Sennrich et al. 2016 (BPE merges).

Supported on import: normalizer null or NFC/NFD/NFKC/NFKD; `ignore_merges`; merges written as
"a b" strings or [a, b] lists; a vocab lacking some single bytes, with `unk_token` / `fuse_unk`
(such bytes are dropped, or become the unk token, as in HF). Ignored on import: post_processor
(e.g. BOS templates), decoder, dropout, truncation, padding, added-token lstrip/rstrip/single_word
flags.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import regex

from attnlab import jsonfile
from attnlab.errors import UserError

from .pretokenize import DIGITS_GPT2_PATTERN, GPT2_PATTERN, pattern_name, token_to_unicode
from .pretokenize import unicode_to_token

NAME = "tokenizer.json"


def _resolve(path) -> Path:
    path = Path(path)
    return path / NAME if path.is_dir() else path


def resolve_path(path) -> Path:
    """`path` itself, or `path/tokenizer.json` when `path` is a directory."""
    return _resolve(path)


def read_json(path) -> dict[str, Any]:
    """The JSON object of a tokenizer file (`path` or `path/tokenizer.json`).

    Raises:
        FileNotFoundError: the file does not exist (names the path).
        ValueError: not valid JSON or not a JSON object.
    """
    path = _resolve(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    return jsonfile.read_json(path)


def write_json_atomic(path, data: dict[str, Any]) -> None:
    """Write JSON to `path` (or `<dir>/tokenizer.json`) atomically."""
    jsonfile.write_json_atomic(_resolve(path), data)


def to_tokenizer_json(token_bytes: dict[int, bytes], merges: list[tuple[int, int]],
                      added: dict[str, int], special_ids: set[int], pattern: str, regex: str,
                      ignore_merges: bool, normalizer: str | None, unk_id: int | None = None,
                      fuse_unk: bool = False) -> dict[str, Any]:
    """Build the `tokenizer.json` object for a byte-level BPE tokenizer.

    Raises:
        ValueError: two tokens would get the same vocab string (an added token equal to the
            byte-level spelling of an ordinary token with another id).
    """
    vocab: dict[str, int] = {}
    for i, b in sorted(token_bytes.items()):
        vocab[token_to_unicode(b)] = i
    for content, i in sorted(added.items(), key=lambda x: x[1]):
        if vocab.setdefault(content, i) != i:
            raise UserError(f"added token {content!r} (id {i}) collides with vocab token "
                            f"id {vocab[content]} of the same spelling")
    spell = {i: token_to_unicode(b) for i, b in token_bytes.items()}
    names = {**spell, **{i: c for c, i in added.items()}}
    if pattern == "gpt2" and regex == GPT2_PATTERN:
        pre = _byte_level(use_regex=True)
    else:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
            _byte_level(use_regex=False)]}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": i in special_ids}
            for c, i in sorted(added.items(), key=lambda x: x[1])],
        "normalizer": {"type": normalizer} if normalizer else None,
        "pre_tokenizer": pre,
        "post_processor": None,
        "decoder": _byte_level(use_regex=True),
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None if unk_id is None else names[unk_id],
            "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": bool(fuse_unk), "byte_fallback": False,
            "ignore_merges": ignore_merges, "vocab": vocab,
            "merges": [f"{spell[a]} {spell[b]}" for a, b in merges],
        },
    }


def _byte_level(use_regex: bool) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
            "use_regex": use_regex}


def from_tokenizer_json(data: dict[str, Any], where: str = NAME) -> dict[str, Any]:
    """Parse a `tokenizer.json` object into `ByteLevelBPE(**kwargs)` keyword arguments.

    Raises:
        ValueError: malformed or unsupported content; the message names the field, e.g.
            "tokenizer.json: model.type is 'WordPiece', expected 'BPE'".
    """
    model = data.get("model")
    if not isinstance(model, dict):
        raise UserError(f"{where}: missing 'model' object")
    if model.get("type", "BPE") != "BPE":
        raise UserError(f"{where}: model.type is {model.get('type')!r}, expected 'BPE'")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise UserError(f"{where}: model.{key} is {model[key]!r}; byte-level BPE has none")
    if model.get("byte_fallback"):
        raise UserError(f"{where}: model.byte_fallback is true (SentencePiece-style), unsupported")
    vocab, merges = model.get("vocab"), model.get("merges")
    if not isinstance(vocab, dict) or not isinstance(merges, list):
        raise UserError(f"{where}: model.vocab must be an object and model.merges a list")
    added = _parse_added(data.get("added_tokens") or [], where)
    added_ids = {i: c for c, i, _ in added}
    token_bytes: dict[int, bytes] = {}
    for spelling, i in vocab.items():
        if not isinstance(i, int) or i < 0:
            raise UserError(f"{where}: model.vocab[{spelling!r}] is {i!r}, expected an id >= 0")
        if added_ids.get(i) == spelling:
            continue
        try:
            token_bytes[i] = unicode_to_token(spelling)
        except ValueError as err:
            raise UserError(f"{where}: model.vocab token {err}") from None
    ids = {token_to_unicode(b): i for i, b in token_bytes.items()}
    pairs = []
    for k, merge in enumerate(merges):
        parts = merge.split(" ") if isinstance(merge, str) else merge
        if not isinstance(parts, list) or len(parts) != 2 or not all(p in ids for p in parts):
            raise UserError(f"{where}: model.merges[{k}] = {merge!r} is not a pair of "
                            "vocab tokens")
        pairs.append((ids[parts[0]], ids[parts[1]]))
    source = _parse_pre_tokenizer(data.get("pre_tokenizer"), where)
    unk = model.get("unk_token")
    unk_id = {**ids, **{c: i for c, i, _ in added}}.get(unk) if unk is not None else None
    if unk is not None and unk_id is None:
        raise UserError(f"{where}: model.unk_token {unk!r} is not in the vocab")
    return {"token_bytes": token_bytes, "merges": pairs, "added_tokens": added,
            "unk_id": unk_id, "fuse_unk": bool(model.get("fuse_unk", False)),
            "pattern": pattern_name(source), "pattern_regex": source,
            "ignore_merges": bool(model.get("ignore_merges", False)),
            "normalizer": _parse_normalizer(data.get("normalizer"), where)}


def _parse_added(items: list, where: str) -> list[tuple[str, int, bool]]:
    out = []
    for k, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("content"), str) \
                or not isinstance(item.get("id"), int):
            raise UserError(f"{where}: added_tokens[{k}] needs a string 'content' and an int 'id'")
        out.append((item["content"], item["id"], bool(item.get("special", False))))
    return out


def _parse_normalizer(norm: Any, where: str) -> str | None:
    if norm is None:
        return None
    kind = norm.get("type") if isinstance(norm, dict) else None
    if kind not in ("NFC", "NFD", "NFKC", "NFKD"):
        raise UserError(f"{where}: normalizer type {kind!r} is unsupported "
                        "(expected null, NFC, NFD, NFKC or NFKD)")
    return kind


def _parse_pre_tokenizer(pre: Any, where: str) -> str:
    """Return the split regex of a supported byte-level pre-tokenizer."""
    kind = pre.get("type") if isinstance(pre, dict) else None
    if kind == "ByteLevel":
        _check_byte_level(pre, where, use_regex=True)
        return GPT2_PATTERN
    if kind == "Sequence" and len(pre.get("pretokenizers") or []) == 2:
        split, byte_level = pre["pretokenizers"]
        if isinstance(split, dict) and split.get("type") == "Digits" \
                and isinstance(byte_level, dict) and byte_level.get("type") == "ByteLevel":
            if not split.get("individual_digits", False):
                raise UserError(f"{where}: pre_tokenizer Digits needs individual_digits true")
            _check_byte_level(byte_level, where, use_regex=True)
            return DIGITS_GPT2_PATTERN  # StarCoder / SmolLM style
        if isinstance(split, dict) and split.get("type") == "Split" \
                and isinstance(byte_level, dict) and byte_level.get("type") == "ByteLevel":
            _check_byte_level(byte_level, where, use_regex=False)
            if split.get("behavior") != "Isolated" or split.get("invert", False):
                raise UserError(f"{where}: pre_tokenizer Split must have behavior 'Isolated' "
                                f"and invert false, got {split.get('behavior')!r}")
            pattern = split.get("pattern") or {}
            if isinstance(pattern.get("Regex"), str):
                return pattern["Regex"]
            if isinstance(pattern.get("String"), str):
                return regex.escape(pattern["String"])
    raise UserError(f"{where}: pre_tokenizer must be ByteLevel or Sequence[Split, ByteLevel] "
                    f"for byte-level BPE, got {kind!r}")


def _check_byte_level(pre: dict, where: str, use_regex: bool) -> None:
    if pre.get("add_prefix_space", False):
        raise UserError(f"{where}: ByteLevel add_prefix_space=true is unsupported")
    if bool(pre.get("use_regex", True)) != use_regex:
        raise UserError(f"{where}: ByteLevel use_regex must be {str(use_regex).lower()} here")
