"""`attnlab serve`: the OpenAI-compatible HTTP server (serve/), a thin call into serve.server.serve.

The server needs the optional `serve` extra (FastAPI, uvicorn, prometheus_client); without it the
rest of the command line works and `attnlab serve` says what to install.
"""
from __future__ import annotations

import argparse
import os

from attnlab.cli.args import nonnegative_float, positive_int
from attnlab.cli.models import engine_args, threads_arg, use_threads
from attnlab.errors import UserError
from attnlab.nn.quant_linear import DTYPES

SERVE_EXTRA = ("fastapi", "uvicorn", "prometheus_client", "starlette", "pydantic")
try:
    from attnlab.serve.server import ServeConfig, serve
except ImportError as e:  # the optional extra is missing: only `attnlab serve` needs it
    if e.name not in SERVE_EXTRA:
        raise
    ServeConfig = serve = None
    MISSING = e.name


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535 (0 = any free port), got {value}")
    return value


def cmd_serve(args) -> None:
    if serve is None:
        raise UserError(f"attnlab serve needs the serve extra ({MISSING} is missing): pip install 'attnlab[serve]'")
    use_threads(args)
    serve(ServeConfig(model=args.model, dtype=args.dtype, embed_model=args.embed_model, host=args.host,
                      port=args.port, max_batch=args.max_batch, max_queue=args.max_queue, ctx_size=args.ctx_size,
                      engine=args.engine, kv_dtype=args.kv_dtype,
                      api_key=args.api_key or os.environ.get("ATTNLAB_API_KEY") or None,
                      drain_seconds=args.drain_seconds))


def add_serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (chat, completions, embeddings; "
                       "continuous batching) with a chat page at /")
    s.add_argument("--model", help="the language model: smollm2-135m, a .gguf file, a HF or run directory")
    s.add_argument("--dtype", choices=DTYPES, default="auto", help="weights in memory (as `generate --dtype`)")
    s.add_argument("--embed-model", help="an encoder for /v1/embeddings: all-minilm-l6-v2 or a BERT directory")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=port, default=8000, help="TCP port (default 8000; 0 = any free port)")
    s.add_argument("--max-batch", type=positive_int, default=16, help="sequences decoded together (default 16)")
    s.add_argument("--max-queue", type=int, default=64, help="requests that may wait for a free slot; "
                   "beyond it 429 with Retry-After (default 64)")
    s.add_argument("--ctx-size", type=positive_int, help="positions per sequence: prompt + completion "
                   "(default: the model's context, at most 2048)")
    engine_args(s)
    s.add_argument("--api-key", help="require `Authorization: Bearer KEY` on /v1 routes (default: "
                   "$ATTNLAB_API_KEY, else no key)")
    threads_arg(s)
    s.add_argument("--drain-seconds", type=nonnegative_float, default=30.0, help="on SIGTERM, how long "
                   "requests in flight may finish before they are cut (default 30)")
    s.set_defaults(func=cmd_serve)
