"""Building blocks of the OpenAPI document shared by the job and OpenAI-compatible paths."""

from __future__ import annotations

from typing import Any

JSON = "application/json"
SSE = "text/event-stream"


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def responses(ok: dict[str, dict[str, Any]], *errors: int) -> dict[str, Any]:
    """Success responses plus the error statuses an operation can return (all JSON errors).

    401 (API keys configured) and 503 (Redis unavailable) can come from every /v1 operation.
    """
    described = dict(ok)
    for status in sorted({*errors, 401, 503}):
        described[str(status)] = {"$ref": "#/components/responses/Error"}
    return described


def body(schema: str) -> dict[str, Any]:
    return {"required": True, "content": {JSON: {"schema": ref(schema)}}}


def json_ok(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def links(parameter: str, expression: str, *operations: str) -> dict[str, Any]:
    """OpenAPI links to ``operations``, their ``parameter`` taken from ``expression``."""
    return {
        operation[0].upper() + operation[1:]: {
            "operationId": operation,
            "parameters": {parameter: expression},
        }
        for operation in operations
    }
