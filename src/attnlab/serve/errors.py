"""OpenAI-style errors: every failure of a request is a JSON object
{"error": {"message", "type", "param", "code"}} with its HTTP status, never a traceback.

The types and codes are OpenAI's (invalid_request_error, authentication_error, not_found_error,
rate_limit_error, server_error; codes such as model_not_found, context_length_exceeded,
invalid_api_key), so client libraries raise their own exception classes (openai.BadRequestError,
openai.NotFoundError, ...) with our message.
"""
from __future__ import annotations

from http import HTTPStatus

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
         415: "invalid_request_error", 429: "rate_limit_error", 503: "server_error"}


class APIError(Exception):
    """A request that cannot be served, with the status and the error object to answer.

    Args:
        status: the HTTP status (400, 401, 404, 413, 429, 503, ...).
        message: one line saying what is wrong, naming the field (param) where there is one.
        param: the request field at fault ("temperature", "messages[0].content") or None.
        code: a machine-readable code (OpenAI's where one exists) or None.
        headers: extra response headers (e.g. Retry-After with 429).
    """

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """The OpenAI error object for `status`."""
    kind = TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


def status_phrase(status: int) -> str:
    """'Not Found' for 404, ... (the message of an error raised by routing itself)."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"
