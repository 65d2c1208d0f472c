"""Request bodies of the OpenAI API, validated: wrong types, missing fields and values out of range
become one APIError (400) naming the field, as OpenAI's own API answers them.

Fields follow OpenAI's reference (chat.completions.create, completions.create, embeddings.create);
`top_k` and `ignore_eos` are extensions, as llama.cpp's server takes them. Validation is strict:
a string is not a number, 1.5 is not an integer, "true" is not a boolean.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError, field_validator

from attnlab.serve.errors import APIError, bad_request

MAX_STOP = 4  # OpenAI's limit on stop strings


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False, validate_default=True)


class StreamOptions(Strict):
    include_usage: StrictBool = False  # a last chunk with usage and no choices


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Any = None  # a string, or a list of {"type": "text", "text": ...} parts
    name: StrictStr | None = None

    @field_validator("content")
    @classmethod
    def _text(cls, v):
        if isinstance(v, str):
            return v
        if v is None:
            return ""
        if isinstance(v, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                       for p in v):
            return "".join(p["text"] for p in v)
        raise ValueError("must be a string or a list of text parts ({\"type\": \"text\", \"text\": ...}); "
                         "this model reads text only")


class Sampling(Strict):
    """The fields chat and text completions share."""

    model: StrictStr
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: StrictInt = Field(0, ge=0)  # 0 = off (llama.cpp's convention)
    stop: Any = None
    seed: StrictInt | None = Field(None, ge=-(2 ** 63), lt=2 ** 64)
    n: StrictInt = 1
    best_of: StrictInt = 1  # completions' candidates: one, as n
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: Any = None
    user: StrictStr | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if v is None:
            return []
        stops = [v] if isinstance(v, str) else v
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ValueError("must be a string or a list of strings")
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings, got {len(stops)}")
        return [s for s in stops if s]

    @field_validator("n", "best_of")
    @classmethod
    def _one_choice(cls, v):
        if v != 1:
            raise ValueError(f"must be 1 (one choice per request), got {v}")
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, v):
        if v != 0:
            raise ValueError(f"is not supported by this server (only 0), got {v}")
        return v

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, v):
        if v not in (None, False, 0):
            raise ValueError("is not supported by this server (log-probabilities)")
        return None

    def seed_value(self) -> int | None:
        """The seed as an unsigned 63-bit generator seed (negative seeds wrap, as numpy's do not)."""
        return None if self.seed is None else self.seed % (2 ** 63)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    tools: Any = None

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, v):
        if v:
            raise ValueError("is not supported by this server (tool calls)")
        return None

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(Sampling):
    prompt: Any
    echo: StrictBool = False
    suffix: StrictStr | None = None

    @field_validator("echo", "suffix")
    @classmethod
    def _unsupported(cls, v):
        if v:
            raise ValueError("is not supported by this server")
        return v

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
            v = v[0]
        if isinstance(v, str):
            return v
        if isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            return v  # token ids
        raise ValueError("must be a string (one prompt) or a non-empty list of token ids")

    def token_limit(self) -> int:
        return 16 if self.max_tokens is None else self.max_tokens  # OpenAI's default for completions


class EmbeddingRequest(Strict):
    model: StrictStr
    input: Any
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(None, ge=1)  # the model's width only (checked by the endpoint)
    user: StrictStr | None = None

    @field_validator("input")
    @classmethod
    def _input(cls, v):
        texts = [v] if isinstance(v, str) else v
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("must be a string or a non-empty list of strings")
        if any(t == "" for t in texts):
            raise ValueError("must not hold an empty string")
        return texts


def parse(model: type[Strict], body: bytes):
    """Validate a JSON body as `model`.

    Raises:
        APIError: 400 naming the byte offset of invalid UTF-8, the JSON error, or the first field at
            fault and what it must be.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"the request body is not valid UTF-8 (byte {e.start})", code="invalid_utf8") from None
    try:
        return model.model_validate_json(text)
    except ValidationError as e:
        raise _field_error(e) from None


def _field_error(e: ValidationError) -> APIError:
    err = e.errors(include_url=False)[0]
    if err["type"] == "json_invalid":
        return bad_request(f"the request body is not valid JSON: {err['msg'].removeprefix('Invalid JSON: ')}",
                           code="invalid_json")
    if err["type"] == "model_type" or not err["loc"]:
        return bad_request("the request body must be a JSON object", code="invalid_json")
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
    if err["type"] == "missing":
        return bad_request(f"'{param}' is required", param=param, code="missing_field")
    msg = err["msg"].removeprefix("Value error, ")
    if msg.startswith("Input should be "):
        msg = "must be " + msg.removeprefix("Input should be ")
    elif err["type"] == "too_short":
        msg = "must not be empty"
    elif not msg.startswith(("is ", "must ", "at most", "an input")):
        msg = "is invalid: " + msg
    return bad_request(f"'{param}' {msg}", param=param, code="invalid_value")
