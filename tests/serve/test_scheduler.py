"""Continuous batching (serve/scheduler.py) on a small deterministic engine: every running sequence
advances in one engine.step per iteration, requests join and leave the batch at any step, a
sequence's tokens do not depend on its neighbours, cancellation frees the slot at the next step."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from attnlab import sampling
from attnlab.engines.base import DecodeEngine
from attnlab.errors import UserError
from attnlab.serve.server import require_servable
from attnlab.tasks.registry import get_task
from attnlab.serve.scheduler import QueueFull, SamplingParams, Scheduler, Sequence, pick_tokens

V = 50


class ToyEngine:
    """A DecodeEngine whose next token is a function of the slot's own history only (sum of its
    tokens and its length), so batching cannot change any sequence's tokens. Records every call."""

    name = "toy"

    def __init__(self, max_batch=4, max_len=64, fail_at_step=None):
        self.max_batch, self.max_len, self.vocab_size = max_batch, max_len, V
        self.history: dict[int, list[int]] = {}
        self.steps: list[list[int]] = []  # the slots of each step call
        self.prefills: list[list[int]] = []
        self.released: list[int] = []
        self.fail_at_step = fail_at_step

    def _logits(self, slot):
        h = self.history[slot]
        out = torch.zeros(V)
        out[(sum(h) * 7 + len(h)) % V] = 1.0
        return out

    def prefill(self, slots, prompts):
        if any(49 in p for p in prompts):
            raise ValueError("token 49 is poison")
        self.prefills.append(list(slots))
        for s, p in zip(slots, prompts):
            assert s not in self.history, "prefill of a busy slot"
            self.history[s] = list(p)
        return torch.stack([self._logits(s) for s in slots])

    def step(self, slots, tokens):
        if self.fail_at_step is not None and len(self.steps) == self.fail_at_step:
            self.steps.append(list(slots))
            raise RuntimeError("engine fault")
        self.steps.append(list(slots))
        assert len(set(slots)) == len(slots)
        for s, t in zip(slots, tokens):
            assert len(self.history[s]) < self.max_len
            self.history[s].append(t)
        return torch.stack([self._logits(s) for s in slots])

    def release(self, slot):
        if self.history.pop(slot, None) is not None:
            self.released.append(slot)

    def length(self, slot):
        return len(self.history.get(slot, []))


class Sink:
    def __init__(self):
        self.tokens, self.end = [], None

    def __call__(self, kind, value):
        assert self.end is None, "an event after the end"
        if kind == "token":
            self.tokens.append(value)
        else:
            self.end = (kind, value)


def request(prompt, max_tokens=8, **kw):
    sink = Sink()
    return Sequence(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw), sink), sink


def alone(prompt, max_tokens, **kw):
    sched = Scheduler(ToyEngine())
    seq, sink = request(prompt, max_tokens, **kw)
    sched.submit(seq)
    while sink.end is None:
        sched.run_once()
    return sink


def test_toy_engine_keeps_the_contract():
    assert isinstance(ToyEngine(), DecodeEngine)


def test_requests_join_and_leave_the_running_batch_at_every_step():
    engine = ToyEngine(max_batch=4)
    sched = Scheduler(engine)
    long, long_sink = request([1, 2, 3], max_tokens=12)
    sched.submit(long)
    for _ in range(3):
        sched.run_once()
    short, short_sink = request([4, 5], max_tokens=3)
    sched.submit(short)  # arrives while the long one runs: joins at the next step
    sched.run_once()
    assert engine.prefills == [[0], [1]]
    while short_sink.end is None:
        sched.run_once()
    assert short_sink.end == ("done", "length") and len(short_sink.tokens) == 3
    assert long_sink.end is None  # the short request did not wait for the long one
    assert 1 in engine.released and sched.free == [1, 2, 3]
    while long_sink.end is None:
        sched.run_once()
    assert long_sink.end == ("done", "length") and len(long_sink.tokens) == 12
    # one engine.step per iteration with every running sequence in it
    assert [len(s) for s in engine.steps] == [1, 1, 1, 2, 2] + [1] * 6  # 12 = 1 from prefill + 11 steps


def test_tokens_are_the_same_alone_and_in_a_batch_arriving_at_other_times():
    prompts = [[i + 1] * (1 + i % 5) for i in range(10)]
    expected = [alone(p, 5 + i).tokens for i, p in enumerate(prompts)]
    engine = ToyEngine(max_batch=4)  # fewer slots than requests: some wait in the queue
    sched = Scheduler(engine)
    sinks = []
    for i, p in enumerate(prompts):
        seq, sink = request(p, 5 + i)
        sched.submit(seq)
        sinks.append(sink)
        if i % 3 == 0:
            sched.run_once()
    while any(s.end is None for s in sinks):
        sched.run_once()
    assert [s.tokens for s in sinks] == expected
    assert max(len(s) for s in engine.steps) == 4 and not engine.history


def test_stop_tokens_max_tokens_and_a_full_context_end_a_sequence():
    free = alone([3], 20)
    stop = free.tokens[4]
    stopped = alone([3], 20, stop_tokens=frozenset([stop]))
    assert stopped.end == ("done", "stop") and stopped.tokens == free.tokens[:free.tokens.index(stop)]
    engine = ToyEngine(max_len=6)
    sched = Scheduler(engine)
    seq, sink = request([1, 2, 3, 4], max_tokens=50)
    sched.submit(seq)
    while sink.end is None:
        sched.run_once()
    assert sink.end == ("done", "length") and len(sink.tokens) == 3  # 4 + 3 - 1 = 6 positions held


def test_a_cancelled_sequence_frees_its_slot_at_the_next_step():
    engine = ToyEngine(max_batch=2)
    sched = Scheduler(engine)
    a, a_sink = request([1], max_tokens=30)
    b, b_sink = request([2], max_tokens=30)
    sched.submit(a)
    sched.submit(b)
    sched.run_once()
    sched.cancel(a)
    sched.run_once()
    assert a_sink.end == ("done", "cancelled") and engine.released == [0]
    assert engine.steps[-1] == [1]  # the step after the cancel ran without it
    waiting, w_sink = request([3], max_tokens=2)
    sched.cancel(waiting)
    sched.submit(waiting)  # cancelled before it got a slot: dropped, never prefilled
    sched.run_once()
    assert w_sink.end == ("done", "cancelled") and engine.prefills == [[0, 1]]


def test_a_full_queue_refuses_with_a_retry_time():
    sched = Scheduler(ToyEngine(max_batch=1), max_queue=2)
    for _ in range(3):  # one takes the free slot, two wait
        sched.submit(request([1])[0])
    with pytest.raises(QueueFull) as e:
        sched.submit(request([1])[0])
    assert e.value.retry_after >= 1


def test_cut_all_ends_running_and_waiting_requests_as_length():
    sched = Scheduler(ToyEngine(max_batch=1))
    (a, a_sink), (b, b_sink) = request([1], 30), request([2], 30)
    sched.submit(a)
    sched.submit(b)
    sched.run_once()
    sched.cut_all()
    sched.run_once()
    assert a_sink.end == ("done", "length") and b_sink.end == ("done", "length") and not b_sink.tokens
    assert sched.engine.history == {}


def test_an_engine_fault_fails_its_batch_and_the_loop_goes_on():
    engine = ToyEngine(fail_at_step=1)
    sched = Scheduler(engine)
    seq, sink = request([1], 10)
    sched.submit(seq)
    sched.run_once()
    sched.run_once()
    assert sink.end[0] == "error" and engine.history == {}
    assert alone([1], 3).end == ("done", "length")
    again, again_sink = request([1], 3)
    sched.submit(again)
    while again_sink.end is None:
        sched.run_once()
    assert again_sink.end == ("done", "length")


def test_a_failed_prefill_fails_only_the_admitted_requests():
    engine = ToyEngine()
    sched = Scheduler(engine)
    running, r_sink = request([1], 10)
    sched.submit(running)
    sched.run_once()
    poison, p_sink = request([49], 10)
    sched.submit(poison)
    sched.run_once()
    assert p_sink.end[0] == "error" and r_sink.end is None and sched.free == [1, 2, 3]
    while r_sink.end is None:
        sched.run_once()
    assert r_sink.tokens == alone([1], 10).tokens


def test_the_thread_serves_submissions_and_stops():
    sched = Scheduler(ToyEngine())
    sched.start()
    done = threading.Event()
    sinks = []
    for p in ([1], [2, 3], [4]):
        sink = Sink()
        seq = Sequence(p, SamplingParams(max_tokens=5, temperature=0.0),
                       lambda kind, value, sink=sink: (sink(kind, value), kind != "token" and done.set()))
        sinks.append(sink)
        sched.submit(seq)
    deadline = time.time() + 10
    while any(s.end is None for s in sinks) and time.time() < deadline:
        time.sleep(0.01)
    assert [s.end for s in sinks] == [("done", "length")] * 3
    sched.stop(timeout=5)
    assert not sched._thread.is_alive()
    with pytest.raises(RuntimeError):
        sched.submit(request([1])[0])


def test_seeded_sampling_does_not_depend_on_the_other_rows():
    torch.manual_seed(0)
    logits = torch.randn(5, V)
    params = [SamplingParams(8, temperature=0.9, top_k=20, top_p=0.9, seed=s) for s in range(5)]
    gens = lambda: [torch.Generator().manual_seed(p.seed) for p in params]  # noqa: E731
    batched = [pick_tokens(logits, params, g) for g in [gens()] for _ in range(1)][0]
    single = [pick_tokens(logits[i:i + 1], params[i:i + 1], gens()[i:i + 1])[0] for i in range(5)]
    assert batched == single
    greedy = SamplingParams(8, temperature=0.0)
    assert pick_tokens(logits, [greedy] * 5, [None] * 5) == logits.argmax(-1).tolist()


def test_the_server_runs_only_what_the_registry_marks_servable():
    """Mamba's states decode through the reference engine, so the registry marks it servable; a family
    whose task is not (the default) is refused by name, before any engine is built."""
    assert get_task("mamba").servable and get_task("gpt").servable
    loaded = SimpleNamespace(task=SimpleNamespace(servable=False), model_type="bigram")
    with pytest.raises(UserError, match="bigram model, which attnlab serve does not run"):
        require_servable(loaded, "runs/bigram")


def test_a_request_whose_sampling_fails_ends_alone(monkeypatch):
    """A client's sampling that raised (a temperature of 1e-40 once made NaN probabilities) ended every
    request in flight with an error; now only its own."""
    real = sampling.sample_next

    def sample_next(logits, temperature, top_k, top_p, generator):
        if top_k == 7:  # the poisoned request
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return real(logits, temperature, top_k, top_p, generator)

    monkeypatch.setattr(sampling, "sample_next", sample_next)
    sched = Scheduler(ToyEngine())
    running, r_sink = request([1], 10)
    sched.submit(running)
    sched.run_once()
    for admitted_first in (True, False):  # its first token (after prefill) or a later step
        sink = Sink()
        seq = Sequence([2], SamplingParams(max_tokens=5, temperature=0.5, top_k=7 if admitted_first else 8), sink)
        sched.submit(seq)
        sched.run_once()
        if not admitted_first:
            seq.params = SamplingParams(max_tokens=5, temperature=0.5, top_k=7)
            sched.run_once()
        assert sink.end[0] == "error" and r_sink.end is None
    while r_sink.end is None:
        sched.run_once()
    assert r_sink.tokens == alone([1], 10).tokens and sched.free == [0, 1, 2, 3]
