import re

import pytest

from attnlab.cli import decode_stats
from attnlab.cli.decode_stats import DecodeStats


def test_rates_count_prompt_and_tokens_after_each_rows_first(monkeypatch):
    clock = iter([10.0, 10.5, 10.5, 10.7, 10.7, 10.9, 10.9])  # start, then 3 steps of 2 rows
    monkeypatch.setattr(decode_stats.time, "perf_counter", lambda: next(clock))
    stats = DecodeStats(prompt_tokens=20)
    stats.start()
    for _ in range(3):
        for row in (0, 1):
            stats.on_token(row, 7)
    r = stats.rates()
    assert r["prefill_tok_s"] == pytest.approx(20 / 0.5)
    assert r["new_tokens"] == 6 and r["decode_s"] == pytest.approx(0.4)
    assert r["decode_tok_s"] == pytest.approx(4 / 0.4)  # 2 rows × 2 steps after the first
    assert stats.line() == "prefill: 20 tokens in 500.0 ms, 40.0 tok/s; decode: 4 tokens in 400.0 ms, 10.0 tok/s"


def test_no_token_or_one_step_gives_no_rate():
    stats = DecodeStats(prompt_tokens=3)
    stats.start()
    assert stats.rates()["decode_tok_s"] is None and stats.rates()["prefill_tok_s"] is None
    stats.on_token(0, 1)
    assert stats.rates()["decode_tok_s"] is None and stats.rates()["prefill_tok_s"] > 0
    assert stats.line().endswith("decode: 0 tokens")


def test_line_format_is_what_the_bench_parses():
    stats = DecodeStats(prompt_tokens=4)
    stats.start()
    for _ in range(5):
        stats.on_token(0, 1)
    assert re.search(r"decode: \d+ tokens in [\d.]+ ms, ([\d.]+) tok/s", stats.line())
