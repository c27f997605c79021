"""OpenAPI description of the OpenAI-compatible operations (see web.openai_requests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from web.openai_requests import (
    MAX_CHAT_TOP_LOGPROBS,
    MAX_CHOICES,
    MAX_COMPLETION_LOGPROBS,
    MAX_PROMPTS,
)
from worker.config import Settings

JSON = "application/json"
SSE = "text/event-stream"

Responses = Callable[..., dict[str, Any]]
Body = Callable[[str], dict[str, Any]]
Ref = Callable[[str], dict[str, str]]


def json_ok(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def openai_paths(responses: Responses, body: Body, ref: Ref) -> dict[str, Any]:
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
    batch_links = {
        operation[0].upper() + operation[1:]: {
            "operationId": operation,
            "parameters": {"batch_id": "$response.body#/id"},
        }
        for operation in ("getBatch", "getBatchOutput", "cancelBatch")
    }
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


def openai_schemas(settings: Settings) -> dict[str, Any]:
    from web.openapi import sampling_properties

    common = {
        **sampling_properties(settings),
        "n": {"type": "integer", "minimum": 1, "maximum": MAX_CHOICES, "nullable": True},
        "stream": {"type": "boolean", "nullable": True},
        "stream_options": {
            "type": "object",
            "nullable": True,
            "additionalProperties": False,
            "properties": {"include_usage": {"type": "boolean"}},
        },
        "user": {"type": "string"},
        "frequency_penalty": {"type": "number", "enum": [0], "nullable": True},
        "presence_penalty": {"type": "number", "enum": [0], "nullable": True},
    }
    text_part = {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
    }
    message = {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {"type": "string", "enum": ["system", "developer", "user", "assistant"]},
            "content": {
                "oneOf": [{"type": "string"}, {"type": "array", "items": text_part}],
            },
        },
    }
    usage = {
        "type": "object",
        "properties": {
            "prompt_tokens": {"type": "integer"},
            "completion_tokens": {"type": "integer"},
            "total_tokens": {"type": "integer"},
        },
    }
    envelope = {
        "id": {"type": "string"},
        "object": {"type": "string"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "job_ids": {"type": "array", "items": {"type": "string"}},
        "usage": usage,
    }
    finish = {"type": "string", "nullable": True, "enum": ["stop", "length"]}
    return {
        "Batch": {
            "type": "object",
            "required": ["id", "object", "status", "request_counts"],
            "properties": {
                "id": {"type": "string"},
                "object": {"type": "string", "enum": ["batch"]},
                "endpoint": {"type": "string"},
                "status": {
                    "type": "string",
                    "enum": ["in_progress", "completed", "cancelling", "cancelled"],
                },
                "created_at": {"type": "integer"},
                "cancelled_at": {"type": "integer", "nullable": True},
                "request_counts": {
                    "type": "object",
                    "properties": {
                        "total": {"type": "integer"},
                        "completed": {"type": "integer"},
                        "failed": {"type": "integer"},
                    },
                },
            },
        },
        "Model": {
            "type": "object",
            "required": ["id", "object", "created", "owned_by"],
            "properties": {
                "id": {"type": "string"},
                "object": {"type": "string", "enum": ["model"]},
                "created": {"type": "integer"},
                "owned_by": {"type": "string"},
                "default": {"type": "boolean"},
                "workers": {"type": "integer"},
                "max_context_tokens": {"type": "integer"},
                "max_prompt_tokens": {"type": "integer"},
                "max_tokens": {"type": "integer"},
            },
        },
        "ModelList": {
            "type": "object",
            "required": ["object", "data"],
            "properties": {
                "object": {"type": "string", "enum": ["list"]},
                "data": {"type": "array", "items": {"$ref": "#/components/schemas/Model"}},
            },
        },
        "CompletionRequest": {
            "type": "object",
            "required": ["prompt"],
            "additionalProperties": False,
            "properties": {
                **common,
                "prompt": {
                    "oneOf": [
                        {"type": "string"},
                        {
                            "type": "array",
                            "items": {"type": "string"},
                            "minItems": 1,
                            "maxItems": MAX_PROMPTS,
                        },
                    ]
                },
                "logprobs": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": MAX_COMPLETION_LOGPROBS,
                    "nullable": True,
                },
                "echo": {"type": "boolean", "nullable": True},
            },
        },
        "ChatCompletionRequest": {
            "type": "object",
            "required": ["messages"],
            "additionalProperties": False,
            "properties": {
                **common,
                "messages": {"type": "array", "items": message, "minItems": 1},
                "max_completion_tokens": common["max_tokens"],
                "logprobs": {"type": "boolean", "nullable": True},
                "top_logprobs": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": MAX_CHAT_TOP_LOGPROBS,
                    "nullable": True,
                },
            },
        },
        "Completion": _result_schema(envelope, "text", {"type": "string"}, finish),
        "ChatCompletion": _result_schema(
            envelope,
            "message",
            {
                "type": "object",
                "properties": {"role": {"type": "string"}, "content": {"type": "string"}},
            },
            finish,
        ),
    }


def _result_schema(
    envelope: dict[str, Any], field: str, schema: dict[str, Any], finish: dict[str, Any]
) -> dict[str, Any]:
    """A completion or chat result: the shared envelope, choices differing in one field."""
    return {
        "type": "object",
        "required": ["id", "object", "choices"],
        "properties": {
            **envelope,
            "choices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index", field, "finish_reason"],
                    "properties": {
                        "index": {"type": "integer"},
                        field: schema,
                        "finish_reason": finish,
                        "logprobs": {"type": "object", "nullable": True},
                    },
                },
            },
        },
    }
