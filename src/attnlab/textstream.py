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
