"""Continuous batching: one loop owns the decode engine and advances every running sequence by one
token per step, admitting waiting requests and retiring finished ones at every step.

Iteration-level scheduling (Orca: Yu et al., OSDI 2022, §3; vLLM: Kwon et al., SOSP 2023): a short
request never waits for a long one to end; it joins the running batch at the next step and leaves
it as soon as it is done, freeing its slot (its own KV cache) for the next one. One thread (this
loop) drives the engine (engines are not thread-safe); request handlers only submit and cancel.

Shape legend: N sequences in one engine call, V vocabulary.
"""
from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch

from attnlab import sampling
from attnlab.engines.base import DecodeEngine
from attnlab.errors import UserError

log = logging.getLogger("attnlab.serve")

FINISH_REASONS = ("stop", "length", "cancelled", "error")


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens (validated by the caller; sampling.check_sampling's rules).

    max_tokens: tokens to generate at most (>= 1). temperature: 0 = greedy. top_k, top_p: the
    sampling chain's filters (None = off). seed: the request's own generator (None = a random seed).
    stop_tokens: ids that end the sequence (not returned).
    """

    max_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_tokens: frozenset[int] = frozenset()


class Sequence:
    """One request inside the scheduler: its prompt, its sampling, its slot and its progress.

    Events go to on_event(kind, value) from the scheduler's thread: ("token", id) for each new token,
    then exactly one ("done", finish_reason) with a reason of FINISH_REASONS, or ("error", message).

    Args:
        prompt: the prompt's token ids (non-empty). params: SamplingParams.
        on_event: the sink of events (must not block: e.g. a thread-safe hand-over to an event loop).
    """

    def __init__(self, prompt: list[int], params: SamplingParams, on_event: Callable[[str, object], None]):
        self.prompt, self.params, self.on_event = list(prompt), params, on_event
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        self.generator = torch.Generator().manual_seed(seed)  # its own: the same draws alone or batched
        self.slot: int | None = None
        self.generated = 0
        self.last_token: int | None = None
        self.cancelled = False
        self.finish_reason: str | None = None
        self.arrived = time.perf_counter()
        self.last_time: float | None = None  # when its last token came (inter-token latency)


class QueueFull(Exception):
    """The waiting queue holds max_queue requests already; retry_after is a suggested wait in seconds."""

    def __init__(self, retry_after: int):
        super().__init__(f"the server is busy: {retry_after} s suggested before retrying")
        self.retry_after = retry_after


class NullMetrics:
    """What the scheduler reports (metrics.ServerMetrics records it); this one records nothing."""

    def queue_depth(self, n: int) -> None: ...
    def batch_size(self, n: int) -> None: ...
    def decode_step(self, n: int) -> None: ...
    def prefilled(self, n: int) -> None: ...
    def first_token(self, seconds: float) -> None: ...
    def next_token(self, seconds: float) -> None: ...


class Scheduler:
    """The loop that owns `engine`: continuous batching of Sequences over its max_batch slots.

    Args:
        engine: a DecodeEngine (engines/base.py). max_queue: requests allowed to wait for a slot
            (submit raises QueueFull beyond it). metrics: where queue depth, batch size and latencies
            go (NullMetrics by default).
    """

    def __init__(self, engine: DecodeEngine, max_queue: int = 64, metrics=None):
        if max_queue < 0:
            raise UserError(f"max_queue={max_queue} must be >= 0", param="max_queue")
        self.engine, self.max_queue, self.metrics = engine, max_queue, metrics or NullMetrics()
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}  # slot -> sequence
        self.free = list(range(engine.max_batch))
        self._cond = threading.Condition()
        self._stopping = False
        self._cut = False
        self._thread: threading.Thread | None = None
        self.steps = 0  # engine.step calls so far (tests read it)
        self.step_seconds = 0.05  # running mean of one engine.step (Retry-After's estimate)

    # ------------------------------------------------------------------ called from other threads
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="attnlab-scheduler", daemon=True)
        self._thread.start()

    def submit(self, seq: Sequence) -> None:
        """Queue `seq` for the next step. Raises QueueFull when max_queue requests wait already."""
        with self._cond:
            if self._stopping:
                raise RuntimeError("the scheduler is stopping")
            if len(self.waiting) - len(self.free) >= self.max_queue:  # those beyond the free slots wait
                raise QueueFull(self.retry_after())
            self.waiting.append(seq)
            self.metrics.queue_depth(len(self.waiting))
            self._cond.notify()

    def retry_after(self) -> int:
        """Seconds a refused client should wait (whole, >= 1): until the running sequence nearest its
        end frees its slot, at the measured time per step."""
        left = [s.params.max_tokens - s.generated for s in self.running.values()] or [1]
        return max(1, math.ceil(min(left) * self.step_seconds))

    def cancel(self, seq: Sequence) -> None:
        """Stop `seq` (its client went away, or a stop string ended it): its slot is freed at the next
        step and it gets ("done", "cancelled") unless it finished already."""
        seq.cancelled = True
        with self._cond:
            self._cond.notify()

    def cut_all(self) -> None:
        """End every running and waiting request at the next step with finish_reason "length" (the
        shutdown deadline passed)."""
        with self._cond:
            self._cut = True
            self._cond.notify()

    def stop(self, timeout: float | None = None) -> None:
        """Cut everything (cut_all) and end the loop; join its thread."""
        with self._cond:
            self._stopping = self._cut = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def load(self) -> tuple[int, int]:
        """(waiting, running) now."""
        with self._cond:
            return len(self.waiting), len(self.running)

    # ------------------------------------------------------------------ the loop (its own thread)
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self.waiting or self.running or self._stopping):
                    self._cond.wait()
                if self._stopping and not (self.waiting or self.running):
                    return
            self.run_once()

    def run_once(self) -> None:
        """One scheduling step (the loop's body; a test may drive the scheduler with it, unstarted)."""
        with self._cond:
            cut, self._cut = self._cut, False
            admitted = self._admit(cut)
        try:
            self.iterate(admitted, cut)
        except Exception:  # a fault of the engine: the batch's requests fail, the server stays up
            log.exception("decode step failed")
            for seq in list(self.running.values()) + admitted:
                self._finish(seq, "error")

    def _admit(self, cut: bool) -> list[Sequence]:
        """Take waiting requests for the free slots (under the lock); drop the cancelled ones."""
        admitted = []
        while self.waiting and (self.free or cut):
            seq = self.waiting.popleft()
            if seq.cancelled or cut:
                self._done(seq, "length" if cut and not seq.cancelled else "cancelled")
                continue
            seq.slot = self.free.pop(0)
            admitted.append(seq)
        self.metrics.queue_depth(len(self.waiting))
        return admitted

    def iterate(self, admitted: list[Sequence], cut: bool = False) -> None:
        """One scheduling step: retire cancelled sequences, prefill the admitted ones (their first
        token), then one engine.step for every running sequence. A failed prefill fails only the
        admitted requests; a failed step, the batch (run_once)."""
        for seq in list(self.running.values()):
            if seq.cancelled or cut:
                self._finish(seq, "length" if cut and not seq.cancelled else "cancelled")
        if admitted:
            for seq in admitted:
                self.running[seq.slot] = seq
            try:
                logits = self.engine.prefill([s.slot for s in admitted], [s.prompt for s in admitted])  # (N, V)
            except Exception:
                log.exception("prefill failed")
                for seq in admitted:
                    self._finish(seq, "error")
            else:
                self.metrics.prefilled(sum(len(s.prompt) for s in admitted))
                try:
                    self._advance(admitted, logits)
                except Exception:
                    log.exception("the first token failed")
                    for seq in admitted:
                        self._finish(seq, "error")
        batch = [s for s in self.running.values() if s.finish_reason is None and not s.cancelled]
        if batch:
            start = time.perf_counter()
            logits = self.engine.step([s.slot for s in batch], [s.last_token for s in batch])  # (N, V)
            self.steps += 1
            self.step_seconds = 0.9 * self.step_seconds + 0.1 * (time.perf_counter() - start)
            self.metrics.decode_step(len(batch))
            self._advance(batch, logits)
        if not self.running:
            self.metrics.batch_size(0)

    def _advance(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Pick each sequence's next token from its row of `logits` (N, V), emit it, finish the done."""
        tokens = pick_tokens(logits, [s.params for s in seqs], [s.generator for s in seqs])
        now = time.perf_counter()
        for seq, token in zip(seqs, tokens):
            if seq.cancelled:
                self._finish(seq, "cancelled")
                continue
            if token is None:  # its sampling failed (pick_tokens logged why): this request only
                self._finish(seq, "error")
                continue
            if token in seq.params.stop_tokens:
                self._finish(seq, "stop")
                continue
            if seq.last_time is None:
                self.metrics.first_token(now - seq.arrived)
            else:
                self.metrics.next_token(now - seq.last_time)
            seq.last_time, seq.last_token = now, token
            seq.generated += 1
            seq.on_event("token", token)
            if seq.generated >= seq.params.max_tokens or self.engine.length(seq.slot) >= self.engine.max_len:
                self._finish(seq, "length")

    def _finish(self, seq: Sequence, reason: str) -> None:
        """Release the sequence's slot and tell its consumer why it ended."""
        if seq.slot is not None:
            self.engine.release(seq.slot)
            with self._cond:
                self.running.pop(seq.slot, None)
                self.free.append(seq.slot)
                self.free.sort()
            seq.slot = None
        self._done(seq, reason)

    def _done(self, seq: Sequence, reason: str) -> None:
        if seq.finish_reason is None:
            seq.finish_reason = reason
            if reason == "error":
                seq.on_event("error", "decoding this request failed (the server's log has the cause)")
            else:
                seq.on_event("done", reason)


def pick_tokens(logits: torch.Tensor, params: list[SamplingParams],
                generators: list[torch.Generator]) -> list[int | None]:
    """The next token of each row of `logits` (N, V): argmax for greedy rows (one call for all of
    them), sampling.sample_next with the row's own generator for the others, so a row's token does
    not depend on the rows beside it. A row whose sampling raises gets None (logged), and the
    others their tokens: one request's failure is its own."""
    out: list[int | None] = logits.argmax(dim=-1).tolist()  # (N,) greedy for every row; sampled rows are replaced
    for i, p in enumerate(params):
        if p.temperature > 0:
            try:
                out[i] = int(sampling.sample_next(logits[i:i + 1], p.temperature, p.top_k, p.top_p, generators[i])[0])
            except Exception:
                log.exception("sampling failed for one request")
                out[i] = None
    return out
