"""Every error of the Messages routes in Anthropic's shape:
``{"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}``.

One hook reshapes the JSON error body whatever raised it (the API-key check, the body reader,
the rate limiter, the view, werkzeug's routing), so no path under ``/v1/messages`` can answer in
OpenAI's shape; the message names the field the OpenAI shape's ``param`` held.
"""

from __future__ import annotations

import json

from flask import Flask, Response, request

from web.anthropic.models import AnthropicError
from web.common.errors import HttpError
from web.streams.sse_events import typed_event

MESSAGES_PATH = "/v1/messages"
# Anthropic's error types by HTTP status (their documented table; 503 is Trickle's Redis or
# broker being away, an api_error there).
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    return TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def anthropic_error(status: int, message: str, param: str | None = None) -> AnthropicError:
    """The body; a message that does not start with the field it is about is prefixed with it."""
    if param and not message.startswith(param):
        message = f"{param}: {message}"
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def error_event(error: HttpError) -> str:
    """``error`` as a message stream's ``error`` event."""
    return typed_event(dict(anthropic_error(error.status, error.message, error.param)))


def is_messages_path(path: str) -> bool:
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def install_error_shape(app: Flask) -> None:
    @app.after_request
    def reshape(response: Response) -> Response:
        if response.status_code < 400 or not is_messages_path(request.path):
            return response
        body = response.get_json(silent=True) if response.is_json else None
        if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
            return response
        if body.get("type") == "error":
            return response  # already Anthropic's
        detail = body["error"]
        message = str(detail.get("message") or "error")
        param = detail.get("param") if isinstance(detail.get("param"), str) else None
        response.set_data(json.dumps(anthropic_error(response.status_code, message, param)))
        return response
