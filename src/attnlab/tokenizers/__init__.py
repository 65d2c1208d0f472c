"""Byte-level BPE tokenizer (Sennrich et al. 2016; Radford et al. 2019), HF tokenizer.json I/O."""
from .bpe import ByteLevelBPE, load_tokenizer
from .pretokenize import pretokenize

__all__ = ["ByteLevelBPE", "load_tokenizer", "pretokenize"]
