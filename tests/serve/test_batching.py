"""Continuous batching through the live server: 16 greedy requests of different lengths, started at
different times, give exactly the tokens each gives alone (and attnlab.generate gives), while the
server decodes them together (far fewer decoding steps than tokens); seeded sampling too. Both at
fp32 and with int8 activations (q8_0 weights): the fused engine's rows do not depend on each other,
bit for bit, so batching changes no token at either precision."""
from __future__ import annotations

import re
import threading
import time

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from attnlab.engines import engine_name  # noqa: E402
from attnlab.generate import generate  # noqa: E402
from attnlab.load import load_causal_lm  # noqa: E402
from tests.serve.conftest import LiveServer  # noqa: E402

WORDS = "the dog runs in snow a small model liked to talk Paris is capital of France".split()


def prompts(n=16):
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(1 + 3 * i)) for i in range(n)]


def counter(text: str, name: str) -> float:
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def run_together(client, model, jobs, stagger):
    """Send `jobs` from one thread each: all threads released at once (a barrier), then request i
    waits stagger * (i % 5) s, so requests arrive at a few different times but well within each
    other's decoding (its length, not the clients' start-up, decides how many overlap)."""
    out = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def one(i, kwargs):
        start.wait(30)
        time.sleep(stagger * (i % 5))
        out[i] = client.completions.create(model=model, **kwargs)

    threads = [threading.Thread(target=one, args=(i, kw)) for i, kw in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


@pytest.fixture(scope="module")
def q8_server(tiny_gguf):
    live = LiveServer(str(tiny_gguf), "--dtype", "q8_0", "--max-batch", "16", "--ctx-size", "512")
    yield live
    assert live.stop() == 0, live.text_log()


@pytest.fixture(scope="module", params=["fp32", "q8_0"])
def served(request, server):
    """(dtype, the live server at that precision)."""
    return request.param, server if request.param == "fp32" else request.getfixturevalue("q8_server")


@pytest.fixture(scope="module")
def client(served):
    with openai.OpenAI(base_url=served[1].base_url, api_key="x", max_retries=0, timeout=120) as c:
        yield c


def test_sixteen_greedy_requests_together_equal_each_alone(client, served, tiny_gguf):
    dtype, server = served
    jobs = [dict(prompt=p, max_tokens=280 + 20 * (i % 7), temperature=0, extra_body={"ignore_eos": True})
            for i, p in enumerate(prompts())]
    alone = [client.completions.create(model=server.model, **kw) for kw in jobs]
    before = httpx.get(server.url + "/metrics").text
    together = run_together(client, server.model, jobs, stagger=0.02)
    after = httpx.get(server.url + "/metrics").text
    assert [r.choices[0].text for r in together] == [r.choices[0].text for r in alone]
    assert [r.usage.completion_tokens for r in together] == [kw["max_tokens"] for kw in jobs]
    tokens = counter(after, "attnlab_generated_tokens_total") - counter(before, "attnlab_generated_tokens_total")
    steps = counter(after, "attnlab_decode_steps_total") - counter(before, "attnlab_decode_steps_total")
    assert tokens == sum(kw["max_tokens"] for kw in jobs)
    assert steps < tokens / 3, (steps, tokens)  # decoded together, not one request after another
    lm = load_causal_lm(str(tiny_gguf), dtype)
    assert httpx.get(server.url + "/health").json()["engine"] == engine_name(lm.model)  # fused-cpp where it runs
    for kw, r in zip(jobs[:4], alone):
        new = generate(lm.model, [lm.tokenizer.encode(kw["prompt"])], kw["max_tokens"], temperature=0.0, stop_tokens=[])
        assert r.choices[0].text == lm.tokenizer.decode(new[0])


def test_seeded_samples_are_the_same_alone_and_batched(client, served):
    server = served[1]
    jobs = [dict(prompt=p, max_tokens=20, temperature=0.8, top_p=0.9, seed=100 + i, extra_body={"ignore_eos": True})
            for i, p in enumerate(prompts(8))]
    alone = [client.completions.create(model=server.model, **kw).choices[0].text for kw in jobs]
    together = [r.choices[0].text for r in run_together(client, server.model, jobs, stagger=0.03)]
    assert together == alone
