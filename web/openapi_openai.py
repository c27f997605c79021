"""OpenAPI paths of the OpenAI-compatible operations (their schemas come from the models)."""

from __future__ import annotations

from typing import Any

from web.openapi_parts import JSON, SSE, body, json_ok, links, ref, responses


def openai_paths() -> dict[str, Any]:
    def generated(schema: str) -> dict[str, Any]:
        return {
            "200": {
                "description": "The result, or with stream: true an SSE stream of chunks "
                "ending with data: [DONE]",
                "content": {JSON: {"schema": ref(schema)}, SSE: {"schema": ref("SseEvent")}},
            }
        }

    model_id = {"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}
    batch_id = {"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"}}
    batch_links = links(
        "batch_id", "$response.body#/id", "getBatch", "getBatchOutput", "cancelBatch"
    )
    return {
        "/v1/models": {
            "get": {
                "operationId": "listModels",
                "responses": responses(
                    {
                        "200": {
                            "description": "Models",
                            "content": {JSON: {"schema": ref("ModelList")}},
                        }
                    }
                ),
            }
        },
        "/v1/models/{model_id}": {
            "get": {
                "operationId": "getModel",
                "parameters": [model_id],
                "responses": responses(
                    {
                        "200": {
                            "description": "A model",
                            "content": {JSON: {"schema": ref("Model")}},
                        }
                    },
                    404,
                ),
            }
        },
        "/v1/completions": {
            "post": {
                "operationId": "createCompletion",
                "summary": "OpenAI-compatible text completion; each choice is a Trickle job",
                "requestBody": body("CompletionRequest"),
                "responses": responses(generated("Completion"), 400, 404, 413, 429, 504),
            }
        },
        "/v1/batches": {
            "post": {
                "operationId": "createBatch",
                "summary": "OpenAI Batch input (JSONL lines with custom_id, method, url, body), "
                "as the request body or an uploaded file; runs at batch priority",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/jsonl": {"schema": {"type": "string"}},
                        "multipart/form-data": {
                            "schema": {
                                "type": "object",
                                "required": ["file"],
                                "properties": {"file": {"type": "string", "format": "binary"}},
                            }
                        },
                    },
                },
                "responses": responses(
                    {"200": {**json_ok("The batch", ref("Batch")), "links": batch_links}},
                    400,
                    413,
                    429,
                ),
            }
        },
        "/v1/batches/{batch_id}": {
            "get": {
                "operationId": "getBatch",
                "parameters": [batch_id],
                "responses": responses({"200": json_ok("The batch", ref("Batch"))}, 404),
            }
        },
        "/v1/batches/{batch_id}/cancel": {
            "post": {
                "operationId": "cancelBatch",
                "parameters": [batch_id],
                "responses": responses({"200": json_ok("The batch", ref("Batch"))}, 404),
            }
        },
        "/v1/batches/{batch_id}/output": {
            "get": {
                "operationId": "getBatchOutput",
                "summary": "OpenAI Batch output JSONL for the requests finished so far",
                "parameters": [batch_id],
                "responses": responses(
                    {
                        "200": {
                            "description": "One JSON object per line",
                            "content": {"application/jsonl": {"schema": {"type": "string"}}},
                        }
                    },
                    404,
                ),
            }
        },
        "/v1/chat/completions": {
            "post": {
                "operationId": "createChatCompletion",
                "summary": "OpenAI-compatible chat completion through the model's chat template",
                "requestBody": body("ChatCompletionRequest"),
                "responses": responses(generated("ChatCompletion"), 400, 404, 413, 429, 504),
            }
        },
    }
