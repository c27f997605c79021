"""The Messages API's operations in the OpenAPI document; their errors are Anthropic's shape
(the ``AnthropicError`` response), their schemas generated from ``web.anthropic.models``."""

from __future__ import annotations

from web.anthropic.models import VERSION_PATTERN
from web.common.openapi_parts import (
    Part,
    body,
    json_ok,
    json_or_events,
    optional_param,
    reply,
    responses,
)

ERROR = "AnthropicError"


def messages_paths() -> Part:
    version = optional_param(
        "header",
        "anthropic-version",
        {"type": "string", "pattern": VERSION_PATTERN},
        "accepted (any date: one Messages API is served); a value that is not a date is a 400",
    )
    resume = optional_param(
        "header",
        "Last-Event-ID",
        {"type": "string", "pattern": "^(|-1|[0-9]{1,18})$"},
        "with stream: true and the Idempotency-Key of the stream to resume: the events after "
        "this delta id",
    )
    key = optional_param(
        "header",
        "Idempotency-Key",
        {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "\\S"},
        "a retry returns the first request's message; its stream runs on without its client",
    )
    created = reply(
        "The message, or with stream: true its events (message_start ... message_stop)",
        json_or_events("Message"),
    )
    return {
        "/v1/messages": {
            "post": {
                "operationId": "createMessage",
                "summary": "Anthropic's Messages API: a message is a Trickle job",
                "parameters": [version, key, resume],
                "requestBody": body("MessagesRequest"),
                "responses": responses({"200": created}, 400, 404, 413, 422, 429, 504, error=ERROR),
            }
        },
        "/v1/messages/count_tokens": {
            "post": {
                "operationId": "countMessageTokens",
                "summary": "The prompt tokens a message with these fields would have",
                "parameters": [version],
                "requestBody": body("CountTokensRequest"),
                "responses": responses(
                    {
                        "200": json_ok(
                            "The count", {"$ref": "#/components/schemas/MessageTokensCount"}
                        )
                    },
                    400,
                    404,
                    413,
                    error=ERROR,
                ),
            }
        },
    }
