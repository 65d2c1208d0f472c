"""Byte-level BPE tokenizer (Sennrich et al. 2016; Radford et al. 2019), HF tokenizer.json I/O,
and the tokenizer stored in GGUF metadata."""
from .bpe import ByteLevelBPE, load_tokenizer
from .gguf import GGUFTokenizer, read_gguf_tokenizer
from .pretokenize import pretokenize

__all__ = ["ByteLevelBPE", "GGUFTokenizer", "load_tokenizer", "pretokenize", "read_gguf_tokenizer"]
