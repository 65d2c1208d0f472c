"""Tiny corpora and helpers shared by the tokenizer tests (the tokenizers train in < 1 s).

No __init__.py in this folder on purpose: a test package named `tokenizers` could shadow the
Hugging Face `tokenizers` library on sys.path.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from attnlab.tokenizers import ByteLevelBPE
from attnlab.tokenizers.gguf import CONTROL, NORMAL, USER_DEFINED

SPECIALS = ["<pad>", "<bos>", "<eos>", "<|a.b|>"]
TEMPLATE = "{% for m in messages %}<bos>{{ m['content'] }}<eos>{% endfor %}"

CORPUS = [
    "Two young, White males are outside near many bushes.",
    "Several men in hard hats are operating a giant pulley system.",
    "A little girl climbing into a wooden playhouse.",
    "A man in a blue shirt is standing on a ladder cleaning windows.",
    "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
    "Mehrere Männer mit Schutzhelmen bedienen ein Antriebsradsystem.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
    "Ein Mann in einem blauen Hemd steht auf einer Leiter und putzt Fenster.",
    "Deux jeunes hommes blancs sont dehors près de buissons. Ça va? Où?",
    "I'm sure they'll say it's 1234567 or 3.14159, don't you THINK'S so?",
    "日本語のテキストと中文文本, 한국어 텍스트, العربية نص, עברית, Ελληνικά, русский.",
    "Emoji 😀😃🎉 👍🏽 🇩🇪 and combining e\u0301 a\u0308 and tabs\tand  double  spaces.",
    "Lines\nwith\r\nbreaks\n\n\nand   trailing   \t\n",
]
TEXTS = CORPUS * 3 + [line.lower() for line in CORPUS] + [line.upper() for line in CORPUS]

STRESS = (
    "Grüße, Zoë! Ça coûte 12,50 € — naïve café. 😀👩‍👩‍👧‍👦🇩🇪 e\u0301\u0302 "
    "中文字符 日本語 한국어 مرحبا بالعالم שלום Привет\t\ttabs  and   spaces\r\n\r\n"
    "line\x00NUL \u00a0nbsp \u2003em\u2028sep I'M DON'T 'S'll 123456789 x\u200dy \n\n  \n"
)


def train(pattern: str = "gpt2", vocab_size: int = 600, **kw) -> ByteLevelBPE:
    return ByteLevelBPE.train(TEXTS, vocab_size, SPECIALS, pattern=pattern, **kw)



def data_file(relative: str) -> Path | None:
    """A real data file (e.g. "multi30k/train.de") on the data search path, or None."""
    from attnlab.data.datasets import search_path
    for root in search_path():
        if (root / relative).is_file():
            return root / relative
    return None


def write_gguf(path: Path, tok: ByteLevelBPE, pre: str, user: str) -> list[str]:
    """Write `tok` as GGUF tokenizer metadata, plus one user-defined token (skip without gguf)."""
    gguf = pytest.importorskip("gguf")
    tokens = [tok.id_to_token(i) for i in range(tok.vocab_size)]
    types = [CONTROL if t in SPECIALS else NORMAL for t in tokens]
    tokens.append(user)  # a user-defined token (plain added token, raw text)
    types.append(USER_DEFINED)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([f"{a} {b}" for a, b in tok.merges])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_chat_template(TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tokens
