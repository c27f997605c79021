"""API errors: every failure leaves as JSON ``{"error": {type, message, param}}``, never HTML.

Bad input is a 4xx naming the field; Redis or the broker being away is a 503 with Retry-After;
only a genuine bug becomes a 500 (logged with its traceback).
"""

from __future__ import annotations

import logging
from typing import Any

import kombu.exceptions
import redis
from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 2


class HttpError(Exception):
    """Raised anywhere in a request to answer it with ``status`` and the JSON error body (the
    client's own error class is ``ops.client.ApiError``)."""

    def __init__(
        self,
        status: int,
        type: str,
        message: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        code: str | None = None,
        job_ids: list[str] | None = None,
    ):
        super().__init__(message)
        self.job_ids = job_ids
        self.status = status
        self.type = type
        self.message = message
        self.param = param
        self.headers = headers or {}
        self.code = code

    def to_dict(self) -> dict[str, Any]:
        """The error body, in the shape OpenAI clients parse (a superset of Trickle's own)."""
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
        }
        if self.job_ids is not None:
            error["job_ids"] = self.job_ids
        return {"error": error}


def invalid(param: str | None, message: str) -> HttpError:
    return HttpError(400, "invalid_request_error", message, param)


def not_found(message: str, param: str | None = None, code: str | None = None) -> HttpError:
    return HttpError(404, "not_found", message, param, code=code)


def error_response(error: HttpError) -> Response:
    response = jsonify(error.to_dict())
    response.status_code = error.status
    response.headers.update(error.headers)
    return response


def too_many(code: str, message: str, retry_after: int) -> HttpError:
    """429 with Retry-After: the client may come back, and when."""
    return HttpError(429, code, message, headers={"Retry-After": str(retry_after)}, code=code)


def unavailable(reason: str, job_ids: list[str] | None = None) -> HttpError:
    """503 with Retry-After; ``job_ids``: the jobs this request created before it failed (the
    client follows them instead of retrying into a second copy)."""
    return HttpError(
        503,
        "service_unavailable",
        reason,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        job_ids=job_ids,
    )


def register_error_handlers(app: Flask) -> None:
    app.register_error_handler(HttpError, error_response)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        kind = {
            400: "invalid_request_error",
            404: "not_found",
            405: "method_not_allowed",
            413: "request_too_large",
        }.get(status, "http_error")
        param = "body" if status in (400, 413) else None
        return error_response(HttpError(status, kind, exc.description or exc.name, param))

    @app.errorhandler(redis.RedisError)
    def redis_down(exc: redis.RedisError) -> Response:
        log.warning("redis unavailable: %s", exc)
        return error_response(unavailable(f"job store (Redis) unavailable: {exc}"))

    @app.errorhandler(kombu.exceptions.OperationalError)
    def broker_down(exc: Exception) -> Response:
        log.warning("broker unavailable: %s", exc)
        return error_response(unavailable(f"job queue (Redis broker) unavailable: {exc}"))

    @app.errorhandler(Exception)
    def bug(exc: Exception) -> Response:
        log.exception("unhandled error")
        return error_response(HttpError(500, "internal_error", "internal server error"))
