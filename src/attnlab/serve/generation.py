"""From a validated request to streamed text: the prompt's token ids (the model's chat template for
chat), the limits of the context, the request's Sequence in the scheduler, and its tokens turned
back into text (UTF-8-safe, cut at stop strings) as they come.

The scheduler runs in its own thread; its events reach the request's coroutine through the event
loop (call_soon_threadsafe), and a coroutine that ends early (its client went away, a stop string)
cancels its Sequence, which frees the batch slot at the next step.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from attnlab.chat import chat_prompt, chat_stop_tokens
from attnlab.errors import UserError
from attnlab.serve.errors import APIError, bad_request
from attnlab.serve.scheduler import QueueFull, SamplingParams, Scheduler, Sequence
from attnlab.textstream import StopStrings, TextStream
from attnlab.wording import counted


@dataclass
class Generation:
    """What one request asks of the language model, checked against the context."""

    prompt: list[int]
    params: SamplingParams
    stops: list[str]


class LanguageModel:
    """The served causal LM: its tokenizer and template (a tasks.LoadedModel) and the scheduler that owns its
    engine.

    Args:
        loaded: a tasks.LoadedModel of a causal LM. scheduler: the Scheduler over its engine (started).
        name: the model id clients send (the --model argument).
    """

    def __init__(self, loaded, scheduler: Scheduler, name: str):
        self.loaded, self.scheduler, self.name = loaded, scheduler, name
        self.max_len = scheduler.engine.max_len
        self.vocab_size = scheduler.engine.vocab_size
        eos = loaded.model.cfg.eos_id
        self.text_stops = frozenset([] if eos is None else [eos])  # completions stop at eos, as generate
        self.chat_stops = frozenset(chat_stop_tokens(loaded))

    # ------------------------------------------------------------------ requests -> Generation
    def chat(self, req) -> Generation:
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.content}
                    for m in req.messages]
        try:
            ids = chat_prompt(self.loaded, messages)
        except UserError as e:
            raise bad_request(str(e), param="messages", code="invalid_value") from None
        return self._generation(ids, req, req.token_limit(), self.chat_stops, "messages")

    def completion(self, req) -> Generation:
        if isinstance(req.prompt, str):
            ids = self.loaded.tokenizer.encode(req.prompt)
        else:
            bad = [t for t in req.prompt if not 0 <= t < self.vocab_size]
            if bad:
                raise bad_request(f"'prompt' has token id {bad[0]} outside the vocabulary (0 .. "
                                  f"{self.vocab_size - 1})", param="prompt", code="invalid_value")
            ids = list(req.prompt)
        return self._generation(ids, req, req.token_limit(), self.text_stops, "prompt")

    def _generation(self, ids: list[int], req, max_tokens: int | None, stops: frozenset, field: str) -> Generation:
        if not ids:
            raise bad_request(f"'{field}' is empty: no token to continue", param=field, code="invalid_value")
        room = self.max_len - len(ids)
        if room < 1 or (max_tokens is not None and max_tokens > room):
            asked = f"; you asked for {len(ids) + max_tokens} ({len(ids)} in the {field}, {max_tokens} in the " \
                    f"completion)" if max_tokens is not None else f"; the {field} has {len(ids)}"
            raise bad_request(f"this model's context is {self.max_len} tokens{asked}",
                              param="max_tokens" if room >= 1 else field, code="context_length_exceeded")
        params = SamplingParams(max_tokens=room if max_tokens is None else max_tokens, temperature=req.temperature,
                                top_k=req.top_k or None, top_p=req.top_p if req.top_p < 1 else None,
                                seed=req.seed_value(), stop_tokens=frozenset() if req.ignore_eos else stops)
        return Generation(ids, params, req.stop)

    # ------------------------------------------------------------------ Generation -> text
    def start(self, gen: Generation) -> "TextRun":
        """Submit `gen` to the scheduler. Raises APIError 429 (with Retry-After) on a full queue,
        503 when the server is stopping."""
        return TextRun(self, gen)


class TextRun:
    """One request's run: iterate `pieces()` for its text as it is generated; then finish_reason and
    completion_tokens say how it ended. Closing the iteration early cancels it."""

    def __init__(self, lm: LanguageModel, gen: Generation):
        self.lm, self.gen = lm, gen
        self.queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.seq = Sequence(gen.prompt, gen.params, lambda kind, value: loop.call_soon_threadsafe(
            self.queue.put_nowait, (kind, value)))
        self.finish_reason: str | None = None
        try:
            lm.scheduler.submit(self.seq)
        except QueueFull as e:
            raise APIError(429, f"the server is busy ({counted(lm.scheduler.max_queue, 'request')} already waiting); "
                           f"retry in {e.retry_after} s", code="queue_full",
                           headers={"Retry-After": str(e.retry_after)}) from None
        except RuntimeError:
            raise APIError(503, "the server is shutting down", code="shutting_down") from None

    @property
    def prompt_tokens(self) -> int:
        return len(self.gen.prompt)

    @property
    def completion_tokens(self) -> int:
        return self.seq.generated

    def cancel(self) -> None:
        if self.seq.finish_reason is None:
            self.lm.scheduler.cancel(self.seq)

    async def pieces(self):
        """Yield the text as it is generated (no empty pieces); sets finish_reason ("stop" or "length").

        Raises:
            APIError: 500 when the engine failed on this request's batch.
        """
        decoded: list[str] = []
        text = TextStream(self.lm.loaded.tokenizer, decoded.append)
        stops = StopStrings(self.gen.stops)
        try:
            while True:
                kind, value = await self.queue.get()
                if kind == "error":
                    raise APIError(500, value, code="engine_error")
                if kind == "token":
                    text.add(value)
                else:
                    text.finish()
                piece = stops.push("".join(decoded))
                decoded.clear()
                if kind == "done" and not stops.stopped:
                    piece += stops.flush()
                if piece:
                    yield piece
                if stops.stopped or kind == "done":
                    self.finish_reason = "stop" if stops.stopped or value == "stop" else "length"
                    return
        finally:
            self.cancel()  # a no-op once finished; otherwise the client left or a stop string ended it
