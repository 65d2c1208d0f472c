"""Tiny corpora and a helper shared by the tokenizer tests (the tokenizers train in < 1 s).

No __init__.py in this folder on purpose: a test package named `tokenizers` could shadow the
Hugging Face `tokenizers` library on sys.path.
"""
from __future__ import annotations

from attnlab.tokenizers import ByteLevelBPE

SPECIALS = ["<pad>", "<bos>", "<eos>", "<|a.b|>"]

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

