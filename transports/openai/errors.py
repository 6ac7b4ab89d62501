"""Errors in the OpenAI API's shape: `{"error": {"message", "type", "param", "code"}}`.

The status codes are the ones OpenAI's clients turn into their exception classes (the `openai`
package: 400 BadRequestError, 401 AuthenticationError, 404 NotFoundError, 413/422 other 4xx,
429 RateLimitError, 500+ InternalServerError), so a client's retry and error handling work as
they do against OpenAI. Restricted APIs answer 401 `authentication_error` / `invalid_auth` and
over-large bodies 413 `content_too_large`, as Triton's own OpenAI frontend does.
"""

from __future__ import annotations

from typing import Optional

import msgspec

from kernel.core.errors import ErrorCode, KernelError

_json = msgspec.json.Encoder()

# The words Triton's schedulers use when a model's queue is full (max_queue_size): a 503 on the
# KServe routes, a 429 with Retry-After on these.
QUEUE_FULL = "Exceeds maximum queue size"
RETRY_AFTER_S = 1

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
RATE_LIMIT = "rate_limit_error"


class ApiError(Exception):
    """An answer in OpenAI's error shape: raised anywhere in a route, written by the app."""

    def __init__(self, status: int, message: str, type: str = INVALID_REQUEST, param: Optional[str] = None,
                 code: Optional[str] = None, retry_after: Optional[int] = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)

    def headers(self) -> list:
        out = [(b"content-type", b"application/json")]
        if self.retry_after is not None:
            out.append((b"retry-after", b"%d" % self.retry_after))
        return out


def error_body(message: str, type: str = INVALID_REQUEST, param: Optional[str] = None,
               code: Optional[str] = None) -> bytes:
    return _json.encode({"error": {"message": message, "type": type, "param": param, "code": code}})


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> ApiError:
    return ApiError(400, message, INVALID_REQUEST, param, code)


def answer_too_large(limit: int, advice: str) -> ApiError:
    """A non-streamed answer that would pass --http-max-json-output-size."""
    return ApiError(400, f"the answer passed {limit} bytes, the most a JSON answer may take "
                         f"(--http-max-json-output-size); {advice}", INVALID_REQUEST, None, "answer_too_large")


def model_not_found(name: str) -> ApiError:
    return ApiError(404, f"The model '{name}' does not exist or is not ready", INVALID_REQUEST, "model",
                    "model_not_found")


def too_many_requests(message: str) -> ApiError:
    return ApiError(429, message, RATE_LIMIT, None, "rate_limit_exceeded", RETRY_AFTER_S)


def from_kernel(error: KernelError, model: str = "") -> ApiError:
    """The OpenAI answer for a core error (a refusal at submit, or a model's error response)."""
    code = error.code
    message = error.message
    if code is ErrorCode.UNAVAILABLE and QUEUE_FULL in message:
        return too_many_requests(f"model '{model}' is busy: {message}; retry later")
    if code is ErrorCode.INVALID_ARG:
        return ApiError(400, message)
    if code is ErrorCode.NOT_FOUND:
        return ApiError(404, message, INVALID_REQUEST, "model" if model else None, "model_not_found")
    if code is ErrorCode.UNAVAILABLE:
        return ApiError(503, message, SERVER_ERROR, None, "service_unavailable")
    if code is ErrorCode.UNSUPPORTED:
        return ApiError(400, message, INVALID_REQUEST, None, "unsupported")
    if code is ErrorCode.ALREADY_EXISTS:
        return ApiError(409, message)
    return ApiError(500, message, SERVER_ERROR)


async def send_error(send, error: ApiError) -> None:
    body = error.body()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [*error.headers(), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})
