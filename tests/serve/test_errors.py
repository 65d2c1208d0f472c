"""Every bad request gets an OpenAI error object with the right status, never a traceback or a 500;
a client that goes away frees its batch slot at the next step."""
from __future__ import annotations

import json
import socket
import time

import pytest

httpx = pytest.importorskip("httpx")

from tests.serve.conftest import CTX, has_minilm, wait_until  # noqa: E402

MSG = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def chat(server, **fields):
    return {"model": server.model, "messages": MSG, **fields}


def check_error(r, status, *words, param=None):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    for w in words:
        assert w in body["error"]["message"], body
    if param is not None:
        assert body["error"]["param"] == param
    return body["error"]


def test_malformed_json_wrong_types_and_missing_fields_are_400_naming_the_field(http, server):
    check_error(http.post("/v1/chat/completions", content=b'{"model": "x", "messages": ['), 400, "not valid JSON")
    check_error(http.post("/v1/chat/completions", content=b"[1, 2]"), 400, "JSON object")
    check_error(http.post("/v1/chat/completions", json={"messages": MSG}), 400, "'model' is required", param="model")
    check_error(http.post("/v1/chat/completions", json={"model": server.model}), 400, "'messages' is required")
    check_error(http.post("/v1/chat/completions", json=chat(server, temperature="hot")), 400, "'temperature'",
                "number", param="temperature")
    check_error(http.post("/v1/chat/completions", json=chat(server, max_tokens=2.5)), 400, "'max_tokens'", "integer")
    check_error(http.post("/v1/chat/completions", json=chat(server, stream="yes")), 400, "'stream'", "boolean")
    bad_role = {"model": server.model, "messages": [{"role": "wizard", "content": "x"}]}
    check_error(http.post("/v1/chat/completions", json=bad_role), 400, "'messages[0].role'", param="messages[0].role")
    bad_content = {"model": server.model, "messages": [{"role": "user", "content": 5}]}
    check_error(http.post("/v1/chat/completions", json=bad_content), 400, "'messages[0].content'")
    check_error(http.post("/v1/completions", json={"model": server.model, "prompt": 3}), 400, "'prompt'")
    e = check_error(http.post("/v1/completions", json={"model": server.model, "prompt": [1, 10 ** 6]}), 400,
                    "outside the vocabulary", param="prompt")
    assert e["code"] == "invalid_value"  # every 400 names its code (it was null for this one)


def test_values_out_of_range_are_400(http, server):
    for fields, name in (({"max_tokens": 0}, "max_tokens"), ({"max_completion_tokens": -1}, "max_completion_tokens"),
                         ({"temperature": -0.1}, "temperature"), ({"temperature": 2.01}, "temperature"),
                         ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": -1}, "top_k"),
                         ({"n": 2}, "n"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
                         ({"presence_penalty": 0.5}, "presence_penalty"), ({"logprobs": True}, "logprobs")):
        check_error(http.post("/v1/chat/completions", json=chat(server, **fields)), 400, f"'{name}'", param=name)
    check_error(http.post("/v1/chat/completions", json={"model": server.model, "messages": []}), 400,
                "'messages' must not be empty")


def test_unknown_model_and_route_are_404_wrong_method_405(http, server):
    e = check_error(http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": MSG}), 404,
                    "'gpt-4o' does not exist")
    assert e["code"] == "model_not_found" and e["type"] == "not_found_error"
    check_error(http.post("/v1/completions", json={"model": "nope", "prompt": "x"}), 404, "'nope'")
    check_error(http.get("/v1/nothing"), 404, "Not Found")
    check_error(http.get("/v1/chat/completions"), 405, "Method Not Allowed")


def test_context_limits_are_400(http, server):
    long = {"model": server.model, "prompt": [5] * (CTX + 1)}
    e = check_error(http.post("/v1/completions", json=long), 400, f"context is {CTX} tokens", param="prompt")
    assert e["code"] == "context_length_exceeded"
    almost = {"model": server.model, "prompt": [5] * (CTX - 1), "max_tokens": 2}  # one position short
    e = check_error(http.post("/v1/completions", json=almost), 400, f"you asked for {CTX + 1}", param="max_tokens")
    assert e["code"] == "context_length_exceeded"
    ok = http.post("/v1/completions", json={"model": server.model, "prompt": "A dog", "max_tokens": 3})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_invalid_utf8_and_a_body_over_the_limit(http, server):
    body = json.dumps(chat(server)).encode().replace(b"Hi", b"H\xff")
    check_error(http.post("/v1/chat/completions", content=body), 400, "not valid UTF-8")
    huge = json.dumps(chat(server, user="x" * (5 << 20))).encode()
    check_error(http.post("/v1/chat/completions", content=huge), 413, "over the limit")
    chunked = http.post("/v1/chat/completions", content=iter([huge[i:i + 65536] for i in range(0, len(huge), 65536)]))
    check_error(chunked, 413, "over the limit")  # no Content-Length: counted as it is read
    assert http.get("/health").json()["status"] == "ok"


def running(http) -> int:
    return http.get("/health").json()["running"]


def test_a_client_that_leaves_mid_stream_frees_its_slot(http, server):
    assert wait_until(lambda: running(http) == 0)
    body = chat(server, max_tokens=CTX - 100, stream=True, ignore_eos=True)
    with httpx.Client(base_url=server.url, timeout=60) as other:
        with other.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            for _ in range(6):
                next(lines)
            assert running(http) == 1
    assert wait_until(lambda: running(http) == 0, timeout=5), "the slot was not freed"


def test_a_client_that_leaves_a_plain_request_frees_its_slot(http, server):
    assert wait_until(lambda: running(http) == 0)
    body = json.dumps(chat(server, max_tokens=CTX - 100, ignore_eos=True)).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert wait_until(lambda: running(http) == 1, timeout=5)
    assert wait_until(lambda: running(http) == 0, timeout=5), "the slot was not freed"
    time.sleep(0.2)
    metrics = http.get("/metrics").text
    assert 'attnlab_requests_total{route="/v1/chat/completions",status="499"}' in metrics


def test_metrics_speak_prometheus(http, server):
    http.post("/v1/completions", json={"model": server.model, "prompt": "A", "max_tokens": 3})
    text = http.get("/metrics")
    assert text.headers["content-type"].startswith("text/plain")
    for name in ("attnlab_requests_total{", "attnlab_generated_tokens_total", "attnlab_queue_depth",
                 "attnlab_running_batch_size", "attnlab_time_to_first_token_seconds_bucket",
                 "attnlab_inter_token_latency_seconds_bucket", "attnlab_prompt_tokens_total"):
        assert name in text.text, name
    assert 'attnlab_requests_total{route="/v1/completions",status="200"}' in text.text


def test_fields_that_would_be_ignored_are_refused(http, server):
    """A tester's best_of 2, dimensions 3 and a 5,000-token embedding input were answered 200 as if
    asked for nothing (n=1, 384 values, the input cut to 256 tokens): each is now a 400 naming it."""
    body = {"model": server.model, "prompt": "x", "best_of": 2}
    check_error(http.post("/v1/completions", json=body), 400, "'best_of'", param="best_of")
    if not has_minilm():
        return
    base = {"model": "all-minilm-l6-v2", "input": "A dog runs."}
    e = check_error(http.post("/v1/embeddings", json={**base, "dimensions": 3}), 400, "'dimensions' must be 384",
                    param="dimensions")
    assert e["code"] == "invalid_value"
    assert http.post("/v1/embeddings", json={**base, "dimensions": 384}).status_code == 200
    e = check_error(http.post("/v1/embeddings", json={**base, "input": ["ok", "word " * 5000]}), 400,
                    "'input[1]' has", "this model's context is", param="input")
    assert e["code"] == "context_length_exceeded"
    check_error(http.post("/v1/embeddings", json={**base, "input": ["a", ""]}), 400,
                "'input' must not hold an empty string", param="input")
