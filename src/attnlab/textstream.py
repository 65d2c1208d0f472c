"""Streaming generated tokens as text: byte-level tokens can cut a multi-byte character in two, so a
piece is released only once it decodes cleanly."""
from __future__ import annotations


class TextStream:
    """Collects token ids and calls on_text(piece) with each new stretch of decoded text.

    Args:
        tokenizer: anything with decode(ids) -> str. on_text: the callback (e.g. a write to stdout).
    """

    def __init__(self, tokenizer, on_text):
        self.tokenizer, self.on_text, self.ids, self.sent = tokenizer, on_text, [], 0

    def add(self, token: int) -> None:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if not text.endswith("\ufffd"):  # U+FFFD: an incomplete UTF-8 sequence so far
            self.on_text(text[self.sent:])
            self.sent = len(text)

    def finish(self) -> None:
        """Release whatever is left (a character that never completed decodes as U+FFFD)."""
        self.on_text(self.tokenizer.decode(self.ids)[self.sent:])
        self.sent = len(self.tokenizer.decode(self.ids))


class StopStrings:
    """Cuts streamed text at the first of some stop strings (OpenAI's `stop`), across pieces.

    push(piece) returns the text that is safe to release: everything except a tail that could still
    be the start of a stop string, which is held until the next piece decides. Once a stop string
    is complete, `stopped` is True and nothing at or after it is ever released.

    Args:
        stops: the stop strings (empty ones are ignored).
    """

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.held, self.stopped = "", False

    def push(self, piece: str) -> str:
        if self.stopped:
            return ""
        text = self.held + piece
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self.held = True, ""
            return text[:min(hits)]
        keep = max((k for s in self.stops for k in range(1, min(len(s), len(text) + 1))
                    if text.endswith(s[:k])), default=0)
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        """The held tail, at the end of the text (it never became a stop string)."""
        out, self.held = ("" if self.stopped else self.held), ""
        return out
