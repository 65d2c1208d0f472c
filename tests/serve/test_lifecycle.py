"""The API key, a full queue (429 + Retry-After), SIGTERM's drain (exit 0), and bad flags (exit 2)."""
from __future__ import annotations

import json
import signal
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from attnlab.cli import main  # noqa: E402
from tests.serve.conftest import LiveServer, wait_until  # noqa: E402

KEY = "sk-test-0123456789"
MSG = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def strict(tiny_gguf):
    """One slot, one waiting place, an API key."""
    live = LiveServer(str(tiny_gguf), "--max-batch", "1", "--max-queue", "1", "--ctx-size", "32768",
                      "--api-key", KEY)
    yield live
    assert live.stop() == 0, live.text_log()


def test_the_api_key_is_required_on_v1_routes(strict):
    with openai.OpenAI(base_url=strict.base_url, api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError, match="valid API key is required"):
            bad.models.list()
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model=strict.model, messages=MSG, max_tokens=2)
    with openai.OpenAI(base_url=strict.base_url, api_key=KEY, max_retries=0) as good:
        assert good.chat.completions.create(model=strict.model, messages=MSG, max_tokens=2).usage.completion_tokens
    r = httpx.post(strict.base_url + "/completions", json={"model": strict.model, "prompt": "x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.get(strict.base_url + "/models", headers={"Authorization": "Basic " + KEY})
    assert r.status_code == 401
    assert httpx.get(strict.url + "/health").status_code == 200  # not under /v1: no key
    assert httpx.get(strict.url + "/").status_code == 200


def test_a_full_queue_answers_429_with_retry_after(strict):
    auth = {"Authorization": f"Bearer {KEY}"}
    long = {"model": strict.model, "prompt": "A dog", "max_tokens": 32000, "ignore_eos": True, "stream": True}
    short = {**long, "stream": False, "max_tokens": 2}
    clients = [httpx.Client(base_url=strict.url, headers=auth, timeout=60) for _ in range(3)]
    try:
        with clients[0].stream("POST", "/v1/completions", json=long) as running:  # takes the one slot
            lines = running.iter_lines()  # kept: a dropped iterator closes the connection (and frees the slot)
            next(lines)
            waiting = threading.Thread(target=lambda: clients[1].post("/v1/completions", json=short))
            waiting.start()  # takes the one waiting place
            assert wait_until(lambda: clients[2].get("/health").json()["waiting"] == 1, timeout=20)
            r = clients[2].post("/v1/completions", json=short)
            assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
            assert r.json()["error"]["type"] == "rate_limit_error" and "busy" in r.json()["error"]["message"]
        waiting.join(30)
        assert clients[2].post("/v1/completions", json=short).status_code == 200  # room again
    finally:
        for c in clients:
            c.close()


def test_sigterm_finishes_short_requests_cuts_long_ones_and_exits_0(tiny_gguf):
    live = LiveServer(str(tiny_gguf), "--ctx-size", "32768", "--max-batch", "4", "--drain-seconds", "3")
    events: dict[str, list] = {"long": [], "short": []}

    def stream(name, max_tokens):
        body = {"model": live.model, "prompt": "A dog", "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        with httpx.stream("POST", live.base_url + "/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events[name].append(line[6:])

    threads = [threading.Thread(target=stream, args=("long", 32000)),
               threading.Thread(target=stream, args=("short", 60))]
    threads[0].start()
    assert wait_until(lambda: len(events["long"]) > 3, timeout=30)
    threads[1].start()
    assert wait_until(lambda: len(events["short"]) > 0, timeout=30)
    start = time.monotonic()
    live.proc.send_signal(signal.SIGTERM)
    assert wait_until(lambda: not _up(live), timeout=5)  # the listening socket is closed: nothing new is accepted
    code = live.proc.wait(30)
    elapsed = time.monotonic() - start
    for t in threads:
        t.join(10)
    assert code == 0, live.text_log()
    assert elapsed < 3 + 6, elapsed  # the drain deadline, and a little
    tokens = {}
    for name in ("long", "short"):
        assert events[name][-1] == "[DONE]", name
        assert json.loads(events[name][-3])["choices"][0]["finish_reason"] == "length"
        tokens[name] = json.loads(events[name][-2])["usage"]["completion_tokens"]
    assert tokens["short"] == 60  # finished within the deadline: every token came
    assert 3 < tokens["long"] < 32000  # cut at the deadline, its response closed properly
    assert "draining" in live.text_log() and "Traceback" not in live.text_log()


def _up(live) -> bool:
    try:
        httpx.get(live.url + "/health", timeout=1)
        return True
    except httpx.TransportError:
        return False


def exit_code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own errors
        return e.code


def test_bad_flags_and_missing_models_exit_2_in_one_line(capsys, tmp_path, tiny_gguf):
    for argv, words in ((["serve", "--model", str(tmp_path / "none.gguf")], "neither a model name"),
                        (["serve", "--model", str(tiny_gguf), "--ctx-size", "40000"],  # it said max_len=40000
                         "--ctx-size 40000 is past the model's context of 32768 positions"),
                        (["serve"], "serve needs a language model (--model NAME) or an encoder (--embed-model NAME)"),
                        (["serve", "--model", "x", "--port", "70000"], "--port"),
                        (["serve", "--model", "x", "--max-batch", "0"], "--max-batch")):
        assert exit_code(argv) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err
