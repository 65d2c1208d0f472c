"""Small helpers for the words of messages and log lines."""
from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """"1 slot", "2 slots", "0 threads": `n` and `noun`, with an s unless n is 1 (regular plurals only)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
