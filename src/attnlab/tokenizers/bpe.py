"""Byte-level BPE tokenizer: train, encode, decode, save/load as Hugging Face `tokenizer.json`.

Sources: Sennrich et al. 2016, "Neural Machine Translation of Rare Words with Subword Units"
(BPE merges); Radford et al. 2019, "Language Models are Unsupervised Multitask Learners",
section 2.2 (BPE on UTF-8 bytes, regex pre-tokenization, no unknown token).

Id layout of a trained tokenizer: special tokens 0..n_special-1 (in the given order), then the
256 byte values, then one token per merge in merge order.
"""
from __future__ import annotations

import unicodedata
from collections import Counter
from typing import Collection, Iterable, Literal, Mapping, Sequence, Union

import regex

from . import hf
from .merge import apply_merges
from .pretokenize import compile_pattern, resolve_pattern, specials_regex, split_isolated
from .pretokenize import token_to_unicode, unicode_to_token
from .trainer import learn_merges

from attnlab.errors import UnknownName, UserError

AllowedSpecial = Union[Literal["all", "none"], Collection[str]]
_CACHE_SIZE = 1 << 17


class ByteLevelBPE:
    """A byte-level BPE tokenizer (pure Python + `regex`), compatible with HF `tokenizers`.

    Build one with `ByteLevelBPE.train(...)` or `ByteLevelBPE.load(path)`. The constructor takes
    the raw tables:
        token_bytes: id -> bytes for every ordinary token (must include all 256 single bytes).
        merges: (left id, right id) pairs in rank order; the result is the token whose bytes are
            the concatenation (it must exist in `token_bytes`).
        added_tokens: (content, id, special) triples, e.g. ("<pad>", 0, True).
        pattern: "gpt2" | "gpt4", or "custom" together with `pattern_regex`.
        ignore_merges: HF option: a pre-token that is itself in the vocab maps straight to its id.
        normalizer: None or a unicodedata form ("NFC", "NFD", "NFKC", "NFKD") for ordinary text.
        unk_id, fuse_unk: only for vocabularies lacking some single bytes (SmolLM2 lacks 21 that
            its training text never held): as HF's BPE model, such a byte is dropped when
            `unk_id` is None, else becomes `unk_id` (consecutive ones fused into one with
            `fuse_unk`). Tokenizers trained here hold all 256 bytes, so never meet this.
    Raises:
        ValueError: inconsistent tables (unknown merge result, duplicates, bad unk_id, ...).
    """

    def __init__(self, token_bytes: Mapping[int, bytes], merges: Sequence[tuple[int, int]],
                 added_tokens: Sequence[tuple[str, int, bool]] = (), pattern: str = "gpt2",
                 pattern_regex: str | None = None, ignore_merges: bool = False,
                 normalizer: str | None = None, unk_id: int | None = None,
                 fuse_unk: bool = False):
        self._pattern = pattern
        self._regex = pattern_regex if pattern_regex is not None else resolve_pattern(pattern)
        self._compiled = compile_pattern(self._regex)
        if normalizer not in (None, "NFC", "NFD", "NFKC", "NFKD"):
            raise UserError(f"normalizer must be None, NFC, NFD, NFKC or NFKD, got {normalizer!r}")
        self._normalizer, self._ignore_merges = normalizer, bool(ignore_merges)
        self._token_bytes = {int(i): bytes(b) for i, b in token_bytes.items()}
        self._bytes_to_id = {b: i for i, b in self._token_bytes.items()}
        if len(self._bytes_to_id) != len(self._token_bytes):
            raise UserError("token_bytes holds two ids with the same bytes")
        self._byte_ids = [self._bytes_to_id.get(bytes([b])) for b in range(256)]
        self._all_bytes = None not in self._byte_ids
        self._unk_id, self._fuse_unk = unk_id, bool(fuse_unk)
        self._merges = [(int(a), int(b)) for a, b in merges]
        self._ranks: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, (a, b) in enumerate(self._merges):
            if a not in self._token_bytes or b not in self._token_bytes:
                raise UserError(f"merge {rank} ({a}, {b}) uses an unknown token id")
            new = self._bytes_to_id.get(self._token_bytes[a] + self._token_bytes[b])
            if new is None:
                raise UserError(f"merge {rank} ({a}, {b}): the merged token is not in the vocab")
            self._ranks[(a, b)] = (rank, new)  # a repeated pair keeps its last rank, as HF
        self._added = {str(c): int(i) for c, i, _ in added_tokens}
        if len(self._added) != len(added_tokens) or "" in self._added:
            raise UserError("added tokens must be distinct non-empty strings")
        self._special_ids = {int(i) for _, i, special in added_tokens if special}
        for content, i in self._added.items():
            if i in self._token_bytes and self._token_bytes[i] != content.encode("utf-8"):
                raise UserError(f"added token {content!r} reuses id {i} of another token")
        if unk_id is not None and unk_id not in self._token_bytes \
                and unk_id not in self._added.values():
            raise UserError(f"unk_id {unk_id} is not a token id")
        self._build_tables()

    def _build_tables(self) -> None:
        size = max([*self._token_bytes, *self._added.values()]) + 1
        table: list[bytes | None] = [None] * size
        for i, b in self._token_bytes.items():
            table[i] = b
        plain = list(table)
        for content, i in self._added.items():
            table[i] = plain[i] = content.encode("utf-8")
            if i in self._special_ids:
                plain[i] = b""
        self._decode_table, self._decode_skip = table, plain
        self._vocab_size = size
        self._cache: dict[str, list[int]] = {}
        self._special_res: dict[frozenset, regex.Pattern] = {}

    # ----------------------------------------------------------------------------- training
    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, special_tokens: Sequence[str] = (),
              pattern: str = "gpt2", min_frequency: int = 2) -> "ByteLevelBPE":
        """Learn a byte-level BPE tokenizer from texts.

        Args:
            texts: the training corpus (iterated once), e.g. lines of a file. Occurrences of the
                special tokens are cut out before counting.
            vocab_size: total size including special tokens and the 256 bytes.
            special_tokens: strings given ids 0..len-1 in this order (e.g. "<pad>", "<bos>").
            pattern: pre-tokenization regex name, "gpt2" or "gpt4".
            min_frequency: stop early when the most frequent pair occurs fewer times.
        Returns:
            The trained tokenizer (fewer than `vocab_size` tokens if it stopped early).
        Raises:
            ValueError: vocab_size < 256 + len(special_tokens) (the message names the minimum),
                unknown pattern, empty or duplicate special tokens.
        Source: Sennrich et al. 2016 (Algorithm 1); Radford et al. 2019 (bytes, pre-tokenizer).
        Tie-break: highest count, then smallest (left bytes, right bytes); see trainer.py.
        """
        specials = list(special_tokens)
        if len(set(specials)) != len(specials) or "" in specials:
            raise UserError(f"special_tokens must be distinct non-empty strings, got {specials}")
        minimum = 256 + len(specials)
        if vocab_size < minimum:
            raise UserError(f"vocab_size={vocab_size} is too small: the minimum is {minimum} "
                            f"(256 bytes + {len(specials)} special tokens)")
        compiled = compile_pattern(resolve_pattern(pattern))
        cutter = specials_regex(specials) if specials else None
        counts: Counter[str] = Counter()
        for text in texts:
            for part in cutter.split(text)[::2] if cutter else (text,):  # odd parts: specials
                counts.update(split_isolated(compiled, part))
        word_counts = {piece.encode("utf-8"): n for piece, n in counts.items()}
        local = learn_merges(word_counts, vocab_size - minimum, min_frequency)
        offset = len(specials)
        token_bytes = [bytes([b]) for b in range(256)]
        for a, b in local:
            token_bytes.append(token_bytes[a] + token_bytes[b])
        return cls({offset + i: tb for i, tb in enumerate(token_bytes)},
                   [(offset + a, offset + b) for a, b in local],
                   [(s, i, True) for i, s in enumerate(specials)], pattern=pattern)

    # ----------------------------------------------------------------------------- encoding
    def encode(self, text: str, allowed_special: AllowedSpecial = "none") -> list[int]:
        """Encode text to token ids.

        Args:
            text: any string (lone surrogates cannot be UTF-8 encoded).
            allowed_special: "all", "none", or a set of added-token strings that are recognised
                as whole units (literal match, longest first); others are encoded as plain text.
        Returns:
            The ids. `allowed_special="all"` equals HF `Tokenizer.encode(text).ids` on the saved
            file (for files with a post-processor, HF may add extra ids such as BOS).
        Raises:
            ValueError: `allowed_special` names a string that is not an added token.
            UnicodeEncodeError: `text` holds a lone surrogate.
        Source: Sennrich et al. 2016 (apply merges by rank); Radford et al. 2019 (byte-level).
        """
        cutter = self._special_cutter(allowed_special)
        if cutter is None:
            return self._encode_ordinary(text)
        ids: list[int] = []
        for k, part in enumerate(cutter.split(text)):
            if k % 2:
                ids.append(self._added[part])
            elif part:
                ids.extend(self._encode_ordinary(part))
        return ids

    def encode_batch(self, texts: Iterable[str], allowed_special: AllowedSpecial = "none"
                     ) -> list[list[int]]:
        """Encode several texts; same arguments and errors as `encode`."""
        return [self.encode(t, allowed_special) for t in texts]

    def _special_cutter(self, allowed: AllowedSpecial) -> regex.Pattern | None:
        if isinstance(allowed, str):
            if allowed not in ("all", "none"):
                raise UserError(f"allowed_special must be 'all', 'none' or a set, got {allowed!r}")
            names = frozenset(self._added) if allowed == "all" else frozenset()
        else:
            names = frozenset(allowed)
            unknown = sorted(names - self._added.keys())
            if unknown:
                raise UserError(f"allowed_special has unknown special tokens {unknown}")
        if not names:
            return None
        if names not in self._special_res:
            self._special_res[names] = specials_regex(names)
        return self._special_res[names]

    def _encode_ordinary(self, text: str) -> list[int]:
        if self._normalizer:
            text = unicodedata.normalize(self._normalizer, text)
        cache, out = self._cache, []
        for piece in split_isolated(self._compiled, text):
            ids = cache.get(piece)
            if ids is None:
                ids = self._bpe(piece.encode("utf-8"))
                if len(cache) >= _CACHE_SIZE:
                    cache.clear()
                cache[piece] = ids
            out.extend(ids)
        return out

    def _bpe(self, data: bytes) -> list[int]:
        """Token ids of one pre-token's bytes (HF `ignore_merges`: a whole vocab token wins)."""
        if self._ignore_merges and data in self._bytes_to_id:
            return [self._bytes_to_id[data]]
        byte_ids = self._byte_ids
        if self._all_bytes:
            return apply_merges([byte_ids[b] for b in data], self._ranks)
        ids: list[int] = []
        after_unk = False
        for b in data:  # a byte without a token: dropped, or unk (HF BPE `unk_token`)
            i = byte_ids[b]
            if i is not None:
                ids.append(i)
                after_unk = False
            elif self._unk_id is not None and not (self._fuse_unk and after_unk):
                ids.append(self._unk_id)
                after_unk = True
        return apply_merges(ids, self._ranks)

    # ----------------------------------------------------------------------------- decoding
    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Decode ids to text: join all token bytes, then one UTF-8 decode with replacement.

        Args:
            ids: token ids.
            skip_special: drop special tokens instead of writing their text.
        Returns:
            The text; invalid UTF-8 (e.g. a cut multi-byte character) becomes U+FFFD.
        Raises:
            ValueError: an id is negative, too large, or unused.
        Source: Radford et al. 2019 (byte-level decoding).
        """
        table = self._decode_skip if skip_special else self._decode_table
        try:
            if len(ids) and min(ids) < 0:
                raise IndexError
            return b"".join([table[i] for i in ids]).decode("utf-8", errors="replace")
        except (IndexError, TypeError):
            bad = next(i for i in ids if not 0 <= i < len(table) or table[i] is None)
            raise UserError(f"token id {bad} is not in the vocabulary "
                            f"(vocab_size={self._vocab_size})") from None

    # ----------------------------------------------------------------------------- vocabulary
    def token_to_id(self, token: str) -> int:
        """Id of a token written as in `tokenizer.json` (byte-level string or added token).

        Raises:
            KeyError: the token is not in the vocabulary.
        """
        if token in self._added:
            return self._added[token]
        try:
            return self._bytes_to_id[unicode_to_token(token)]
        except (KeyError, ValueError):
            raise UnknownName(f"token {token!r} is not in the vocabulary") from None

    def id_to_token(self, token_id: int) -> str:
        """The `tokenizer.json` spelling of an id (e.g. " the" -> "Ġthe"; specials as is).

        Raises:
            KeyError: the id is not in the vocabulary.
        """
        for content, i in self._added.items():
            if i == token_id:
                return content
        if token_id in self._token_bytes:
            return token_to_unicode(self._token_bytes[token_id])
        raise UnknownName(f"token id {token_id} is not in the vocabulary "
                       f"(vocab_size={self._vocab_size})")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token decodes to (a special token's UTF-8 text).

        Raises:
            KeyError: the id is not in the vocabulary.
        """
        table = self._decode_table
        if not 0 <= token_id < len(table) or table[token_id] is None:
            raise UnknownName(f"token id {token_id} is not in the vocabulary (vocab_size={self._vocab_size})")
        return table[token_id]

    @property
    def vocab_size(self) -> int:
        """Largest id + 1 (the embedding size a model needs)."""
        return self._vocab_size

    @property
    def special_tokens(self) -> dict[str, int]:
        """Special tokens: content -> id."""
        return {c: i for c, i in self._added.items() if i in self._special_ids}

    @property
    def added_tokens(self) -> list[tuple[str, int, bool]]:
        """Added tokens as (content, id, special), by id."""
        return sorted(((c, i, i in self._special_ids) for c, i in self._added.items()), key=lambda t: t[1])

    @property
    def pattern(self) -> str:
        """Pre-tokenization pattern name: "gpt2", "gpt4" or "custom"."""
        return self._pattern

    @property
    def pattern_regex(self) -> str:
        """The pre-tokenization regex source."""
        return self._regex

    @property
    def merges(self) -> list[tuple[str, str]]:
        """The merges in rank order, as byte-level strings (e.g. ("Ġ", "t"))."""
        return [(token_to_unicode(self._token_bytes[a]), token_to_unicode(self._token_bytes[b]))
                for a, b in self._merges]

    def __repr__(self) -> str:
        return (f"ByteLevelBPE(vocab_size={self._vocab_size}, merges={len(self._merges)}, "
                f"special_tokens={self.special_tokens}, pattern={self._pattern!r})")

    # ----------------------------------------------------------------------------- files
    def save(self, path) -> None:
        """Write HF `tokenizer.json` (atomically); a directory gets `tokenizer.json` inside.

        Raises:
            ValueError: an added token's text equals another token's vocab spelling.
            OSError: the file cannot be written.
        Source: Hugging Face `tokenizers` serialization format (model type "BPE").
        """
        data = hf.to_tokenizer_json(
            self._token_bytes, self._merges, self._added, self._special_ids, self._pattern,
            self._regex, self._ignore_merges, self._normalizer, self._unk_id, self._fuse_unk)
        hf.write_json_atomic(path, data)

    @classmethod
    def load(cls, path) -> "ByteLevelBPE":
        """Read a byte-level BPE `tokenizer.json` (ours, or HF's GPT-2 / LLaMA-3 / Qwen style).

        Args:
            path: the file, or a directory holding `tokenizer.json`.
        Raises:
            FileNotFoundError: no such file (the message names the path).
            ValueError: malformed or unsupported file (the message says which field).
        """
        where = str(hf.resolve_path(path))
        kwargs = hf.from_tokenizer_json(hf.read_json(path), where)
        try:
            return cls(**kwargs)
        except ValueError as err:
            raise UserError(f"{where}: {err}") from None


def load_tokenizer(path) -> ByteLevelBPE:
    """Load a `tokenizer.json`; same as `ByteLevelBPE.load` (same errors)."""
    return ByteLevelBPE.load(path)
