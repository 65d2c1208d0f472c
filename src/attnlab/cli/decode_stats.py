"""`attnlab generate --stats`: the run's own prefill and decode rates, timed inside the process.

llama.cpp's CLI prints the same two figures ("prompt eval" and "eval" tok/s): start-up and model
loading are left out, so the decode rate can be set beside a benchmark's (bench/inference.py --cli).
Prefill: the prompt tokens (all rows) over the time from the call to the first generated token of the
batch (which includes choosing that token). Decode: the tokens generated after each row's first, over
the time from the batch's first token to its last; every token's on_token work (streaming the text to
stdout) is inside it, as a user of the CLI sees it.
"""
from __future__ import annotations

import time


class DecodeStats:
    """Collects token times through generate()'s on_token callback; line() formats the two rates.

    Usage: stats = DecodeStats(prompt_tokens); stats.start(); generate(..., on_token=stats.on_token)
    (call any other per-token callback from yours); print(stats.line()).
    """

    def __init__(self, prompt_tokens: int):
        self.prompt_tokens = prompt_tokens
        self.t0 = self.first = self.last = None
        self.tokens = 0
        self.rows: set[int] = set()

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def on_token(self, row: int, token: int) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now
        self.tokens += 1
        self.rows.add(row)

    def rates(self) -> dict:
        """{"prefill_tok_s", "decode_tok_s", "prompt_tokens", "new_tokens", ...}; a rate is None when
        nothing was timed (no token generated, or one step only)."""
        out = {"prompt_tokens": self.prompt_tokens, "new_tokens": self.tokens,
               "prefill_s": None, "decode_s": None, "prefill_tok_s": None, "decode_tok_s": None}
        if self.first is None or self.t0 is None:
            return out
        out["prefill_s"] = self.first - self.t0
        out["prefill_tok_s"] = self.prompt_tokens / out["prefill_s"] if out["prefill_s"] > 0 else None
        after_first = self.tokens - len(self.rows)
        out["decode_s"] = self.last - self.first
        out["decode_tok_s"] = after_first / out["decode_s"] if after_first and out["decode_s"] > 0 else None
        return out

    def line(self) -> str:
        r = self.rates()
        def part(name, n, s, rate):
            return f"{name}: {n} tokens" + ("" if rate is None else f" in {s * 1000:.1f} ms, {rate:.1f} tok/s")
        return "; ".join([part("prefill", r["prompt_tokens"], r["prefill_s"], r["prefill_tok_s"]),
                          part("decode", r["new_tokens"] - len(self.rows), r["decode_s"], r["decode_tok_s"])])
