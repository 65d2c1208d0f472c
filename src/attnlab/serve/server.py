"""Run `attnlab serve`: load the models, start the scheduler over a decode engine, serve the app with
uvicorn on a bound socket, and shut down cleanly.

Shutdown (SIGTERM or Ctrl-C): the listening socket closes, /health and new requests answer 503,
requests in flight go on; `drain_seconds` after the signal whatever still runs is cut (its response
ends normally, finish_reason "length"), the scheduler stops, and the process exits 0.
"""
from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading
from dataclasses import dataclass

import torch
import uvicorn

from attnlab.engines import choose_engine, context_limit
from attnlab.errors import UserError
from attnlab.load import load_causal_lm, load_encoder
from attnlab.serve.app import ServerState, create_app
from attnlab.serve.generation import LanguageModel
from attnlab.serve.metrics import ServerMetrics
from attnlab.serve.scheduler import Scheduler
from attnlab.wording import counted

DEFAULT_CTX = 2048  # positions per slot when the model allows more (each slot holds its own KV cache)


@dataclass
class ServeConfig:
    """The settings of `attnlab serve` (its flags)."""

    model: str | None                 # name, directory or .gguf of the causal LM (None: embeddings only)
    dtype: str = "auto"               # nn.quant_linear.DTYPES
    embed_model: str | None = None    # an encoder for /v1/embeddings
    host: str = "127.0.0.1"
    port: int = 8000                  # 0 = any free port (the line on stderr says which)
    max_batch: int = 16               # sequences decoded together (engine slots)
    max_queue: int = 64               # requests that may wait for a slot (429 beyond)
    ctx_size: int | None = None       # positions per slot (default: the model's context, at most DEFAULT_CTX)
    engine: str = "auto"              # engines.ENGINES: auto (the fused C++ step where it runs), fused-cpp, reference
    kv_dtype: str = "auto"            # the fused engine's KV cache: auto (fp16 for quantized weights), fp32, fp16
    api_key: str | None = None        # required on /v1 routes as `Authorization: Bearer KEY`
    drain_seconds: float = 30.0       # after SIGTERM, how long requests in flight may go on
    max_body: int = 4 << 20           # bytes (413 beyond)

    def check(self) -> None:
        """Raises UserError naming the setting out of range."""
        if self.max_batch < 1:
            raise UserError(f"max_batch={self.max_batch} must be >= 1", param="max_batch")
        if self.max_queue < 0:
            raise UserError(f"max_queue={self.max_queue} must be >= 0", param="max_queue")
        if self.ctx_size is not None and self.ctx_size < 2:
            raise UserError(f"ctx_size={self.ctx_size} must be >= 2 (a prompt token and a new one)", param="ctx_size")
        if self.drain_seconds < 0:
            raise UserError(f"drain_seconds={self.drain_seconds} must be >= 0", param="drain_seconds")
        if not 0 <= self.port <= 65535:
            raise UserError(f"port={self.port} must be in 0..65535 (0 = any free port)", param="port")
        if self.model is None and self.embed_model is None:
            raise UserError("serve needs a language model (model=NAME) or an encoder (embed_model=NAME), or both",
                            param=("model", "embed_model"))


def make_engine(model, max_batch: int, ctx_size: int | None, engine: str = "auto", kv_dtype: str = "auto"):
    """The decode engine of `model` (engines.choose_engine: the fused C++ step where it runs, else
    the reference) with max_batch slots of ctx_size positions (default: the model's context, at
    most DEFAULT_CTX).

    Raises:
        UserError: ctx_size past the model's context (named as ctx_size, the server's option).
    """
    limit = context_limit(model)
    if ctx_size is None:
        ctx_size = DEFAULT_CTX if limit is None else min(limit, DEFAULT_CTX)
    elif limit is not None and ctx_size > limit:
        raise UserError(f"ctx_size={ctx_size} is past the model's context of {limit} positions", param="ctx_size")
    return choose_engine(model, max_batch, ctx_size, engine, kv_dtype)


def require_servable(loaded, name: str):
    """`loaded` (a tasks.LoadedModel) if its task says `attnlab serve` runs it (Task.servable).

    Raises:
        UserError: naming the model and its family when the registry marks it not servable.
    """
    if not loaded.task.servable:
        raise UserError(f"{name} is a {loaded.model_type} model, which attnlab serve does not run "
                        f"(its task is not marked servable in tasks/registry.py)", param="model")
    return loaded


def build_state(cfg: ServeConfig) -> ServerState:
    """Load the models and start the scheduler: everything the app serves."""
    cfg.check()
    metrics = ServerMetrics()
    lm = None
    if cfg.model is not None:
        loaded = require_servable(load_causal_lm(cfg.model, cfg.dtype), cfg.model)
        engine = make_engine(loaded.model, cfg.max_batch, cfg.ctx_size, cfg.engine, cfg.kv_dtype)
        scheduler = Scheduler(engine, cfg.max_queue, metrics)
        scheduler.start()
        lm = LanguageModel(loaded, scheduler, cfg.model)
    embedder = load_encoder(cfg.embed_model) if cfg.embed_model is not None else None
    return ServerState(lm, embedder, cfg.embed_model, cfg.api_key, cfg.max_body, metrics)


def describe(state: ServerState, url: str) -> str:
    """The one line that says where the server listens and what it serves."""
    parts = []
    if state.lm is not None:
        e = state.lm.scheduler.engine
        cache = f", {e.kv_dtype} KV cache" if getattr(e, "kv_dtype", None) else ""  # the fused engine's choice
        slots = counted(e.max_batch, "slot")
        parts.append(f"{state.lm.name} (engine {e.name}, {slots} x {e.max_len} positions{cache})")
    if state.embedder is not None:
        parts.append(f"embeddings {state.embed_name}")
    return f"attnlab serve: listening on {url} serving {'; '.join(parts)}; {counted(torch.get_num_threads(), 'thread')}"


def serve(cfg: ServeConfig) -> None:
    """Serve until SIGTERM / Ctrl-C, then drain (see the module docstring) and return."""
    state = build_state(cfg)
    sock = socket.socket(socket.AF_INET6 if ":" in cfg.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((cfg.host, cfg.port))
    except OSError as e:
        raise OSError(f"cannot listen on {cfg.host}:{cfg.port}: {e.strerror}") from None
    sock.listen(128)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(create_app(state), log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=cfg.drain_seconds + 5, timeout_keep_alive=5)
    server = DrainingServer(config, state, cfg.drain_seconds)
    print(describe(state, f"http://{host}:{port}"), file=sys.stderr, flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        if state.lm is not None:
            state.lm.scheduler.stop(timeout=10)
        sock.close()
    print("attnlab serve: stopped", file=sys.stderr, flush=True)


class DrainingServer(uvicorn.Server):
    """uvicorn.Server with the drain: on the first SIGTERM/SIGINT the state turns to draining and,
    drain_seconds later, the scheduler cuts what still runs, while uvicorn waits for the connections
    in flight to end (a second Ctrl-C forces the exit). The captured signal is not raised again at
    exit (uvicorn's default), so the process exits 0."""

    def __init__(self, config: uvicorn.Config, state: ServerState, drain_seconds: float):
        super().__init__(config)
        self.state, self.drain_seconds = state, drain_seconds

    def handle_exit(self, sig, frame) -> None:
        if not self.state.draining:
            self.state.draining = True
            print(f"attnlab serve: draining (requests in flight get {self.drain_seconds:g} s)", file=sys.stderr,
                  flush=True)
            if self.state.lm is not None:
                timer = threading.Timer(self.drain_seconds, self.state.lm.scheduler.cut_all)
                timer.daemon = True
                timer.start()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        before = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in before.items():
                signal.signal(s, handler)
