"""Building blocks of the OpenAPI document (``web.api_schema``): references, bodies, answers,
parameters and links, shared by the modules that write its paths."""

from __future__ import annotations

from typing import Any

JSON = "application/json"
SSE = "text/event-stream"
JSONL = "application/jsonl"
Part = dict[str, Any]  # an object of the document

# One Server-Sent Event as a client parses it; ``data`` holds JSON (or [DONE]).
SSE_EVENT_SCHEMA = {
    "type": "object",
    "properties": {
        "event": {"type": "string"},
        "data": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer"},
    },
}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def responses(ok: dict[str, Part], *errors: int, error: str = "Error") -> Part:
    """Success responses plus the error statuses an operation can return (all JSON errors).

    401 (API keys configured) and 503 (Redis unavailable) can come from every /v1 operation.
    """
    described = dict(ok)
    for status in sorted({*errors, 401, 503}):
        described[str(status)] = {"$ref": f"#/components/responses/{error}"}
    return described


def body(schema: str) -> Part:
    return {"required": True, "content": {JSON: {"schema": ref(schema)}}}


def reply(description: str, content: Part, links_: Part | None = None) -> Part:
    """One response, with the OpenAPI ``links`` a stateful fuzzer follows from it."""
    described: Part = {"description": description, "content": content}
    if links_ is not None:
        described["links"] = links_
    return described


def json_ok(description: str, schema: Part, links_: Part | None = None) -> Part:
    return reply(description, {JSON: {"schema": schema}}, links_)


def json_or_events(schema: str) -> Part:
    """The object as JSON, or (``stream: true``) the Server-Sent Events that build it."""
    return {JSON: {"schema": ref(schema)}, SSE: {"schema": ref("SseEvent")}}


def path_param(name: str) -> Part:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def optional_param(where: str, name: str, schema: Part, description: str | None = None) -> Part:
    """An optional ``query`` or ``header`` parameter."""
    param: Part = {"name": name, "in": where, "required": False}
    if description is not None:
        param["description"] = description
    param["schema"] = schema
    return param


def links(parameter: str, expression: str, *operations: str) -> Part:
    """OpenAPI links to ``operations``, their ``parameter`` taken from ``expression``."""
    return {
        operation[0].upper() + operation[1:]: {
            "operationId": operation,
            "parameters": {parameter: expression},
        }
        for operation in operations
    }
