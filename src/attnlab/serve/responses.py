"""OpenAI's response objects, as the `openai` package's types parse them: chat.completion and its
chat.completion.chunk stream, text_completion, the embedding list, the model list; and the
server-sent-event framing of a stream (`data: {...}` events, then `data: [DONE]`).
"""
from __future__ import annotations

import base64
import json
import time
import uuid

import numpy as np


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def sse(obj) -> bytes:
    """One server-sent event: `data: <json>` and a blank line."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


class Shapes:
    """The objects of one request (one id and creation time for all of its chunks).

    Args:
        kind: "chat" (chat.completion) or "text" (text_completion). model: the model id answered.
    """

    def __init__(self, kind: str, model: str):
        self.kind, self.model = kind, model
        self.id = new_id("chatcmpl" if kind == "chat" else "cmpl")
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": "attnlab"}

    def complete(self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> dict:
        """The whole response (stream false)."""
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
            head = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            head = self._head("text_completion")
        return {**head, "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}

    def chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False,
              with_usage: bool = False) -> dict:
        """One streamed chunk: a piece of text, or (text None) the closing chunk with finish_reason.
        with_usage: the chunk carries "usage": null (stream_options.include_usage)."""
        if self.kind == "chat":
            delta = {} if text is None else ({"role": "assistant", "content": text} if first else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            out = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
            out = {**self._head("text_completion"), "choices": [choice]}
        if with_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        """The last chunk of a stream with stream_options.include_usage: no choices, the usage."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(prompt_tokens, completion_tokens)}


def embeddings(vectors: np.ndarray, model: str, tokens: int, encoding_format: str) -> dict:
    """The embedding list of (B, D) float32 `vectors`; "base64" encodes each row's little-endian
    float32 bytes (what the openai client asks for by default and decodes)."""
    rows = []
    for i, v in enumerate(vectors):
        data = (base64.b64encode(v.astype("<f4").tobytes()).decode() if encoding_format == "base64"
                else [float(x) for x in v])
        rows.append({"object": "embedding", "index": i, "embedding": data})
    return {"object": "list", "data": rows, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def model_card(name: str, created: int, kind: str) -> dict:
    return {"id": name, "object": "model", "created": created, "owned_by": "attnlab", "kind": kind}
