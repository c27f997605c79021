"""OpenAPI paths of the Responses API (its schemas come from the request and response models)."""

from __future__ import annotations

from typing import Any

from web.openapi_parts import JSON, SSE, body, json_ok, links, ref, responses


def responses_paths() -> dict[str, Any]:
    response_id = {
        "name": "response_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
    }
    from_body = links(
        "response_id",
        "$response.body#/id",
        "getResponse",
        "cancelResponse",
        "deleteResponse",
    )
    from_path = links("response_id", "$request.path.response_id", "cancelResponse")
    response_or_events = {
        JSON: {"schema": ref("Response")},
        SSE: {"schema": ref("SseEvent")},
    }
    flag = {"type": "string", "enum": ["true", "false"]}
    return {
        "/v1/responses": {
            "post": {
                "operationId": "createResponse",
                "summary": "OpenAI's Responses API: a response is a Trickle job; with "
                "background: true it runs without the connection and its stream resumes",
                "requestBody": body("ResponseCreateRequest"),
                "responses": responses(
                    {
                        "200": {
                            "description": "The response, or with stream: true its events "
                            "(response.created ... response.completed), each numbered",
                            "content": response_or_events,
                            "links": from_body,
                        }
                    },
                    400,
                    404,
                    413,
                    429,
                    504,
                ),
            }
        },
        "/v1/responses/{response_id}": {
            "get": {
                "operationId": "getResponse",
                "summary": "A stored response; with stream=true its events after "
                "starting_after (waiting for those not known yet)",
                "parameters": [
                    response_id,
                    {"name": "stream", "in": "query", "required": False, "schema": flag},
                    {
                        "name": "starting_after",
                        "in": "query",
                        "required": False,
                        "description": "the sequence number of the last event already read",
                        "schema": {"type": "integer", "minimum": 0},
                    },
                    {
                        "name": "include_obfuscation",
                        "in": "query",
                        "required": False,
                        "description": "accepted; Trickle never pads",
                        "schema": flag,
                    },
                ],
                "responses": responses(
                    {
                        "200": {
                            "description": "The response, or its events",
                            "content": response_or_events,
                            "links": from_path,
                        }
                    },
                    400,
                    404,
                ),
            },
            "delete": {
                "operationId": "deleteResponse",
                "summary": "Forget a stored response (a running one is canceled)",
                "parameters": [response_id],
                "responses": responses(
                    {"200": json_ok("Deleted", ref("ResponseDeleted"))},
                    404,
                ),
            },
        },
        "/v1/responses/{response_id}/cancel": {
            "post": {
                "operationId": "cancelResponse",
                "summary": "Cancel a response; a running one ends after a token flush and a step",
                "parameters": [response_id],
                "responses": responses({"200": json_ok("The response", ref("Response"))}, 404),
            }
        },
    }
