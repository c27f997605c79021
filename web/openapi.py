"""The OpenAPI 3 description of the job API, served at ``/openapi.json``.

Built from the same limits the validator enforces, so the document cannot promise more than the
server accepts.
"""

from __future__ import annotations

from typing import Any

from worker.config import Settings
from worker.jobs import FinishReason, JobStatus

ERROR_RESPONSE = {"$ref": "#/components/responses/Error"}


def openapi_document(settings: Settings) -> dict[str, Any]:
    limits = settings.limits
    job_id = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
    prefer = {
        "name": "Prefer",
        "in": "header",
        "required": False,
        "description": "wait=N: wait up to N seconds (max "
        f"{settings.web.max_wait_seconds}) for the job to finish",
        "schema": {"type": "string", "example": "wait=10"},
    }
    job_ok = {"description": "The job", "content": {"application/json": {"schema": _ref("Job")}}}
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "Trickle",
            "version": "0.1.0",
            "description": "Batch-and-stream text generation: submit, poll, wait or stream jobs.",
        },
        "paths": {
            "/v1/jobs": {
                "post": {
                    "operationId": "submitJob",
                    "summary": "Submit a generation job",
                    "parameters": [prefer],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("JobRequest")}},
                    },
                    "responses": {
                        "200": {**job_ok, "description": "Finished within Prefer: wait"},
                        "202": {**job_ok, "description": "Accepted (queued or running)"},
                        "400": ERROR_RESPONSE,
                        "404": ERROR_RESPONSE,
                        "413": ERROR_RESPONSE,
                        "503": ERROR_RESPONSE,
                    },
                }
            },
            "/v1/jobs/{job_id}": {
                "get": {
                    "operationId": "getJob",
                    "summary": "Read a job (output so far, or the final result)",
                    "parameters": [job_id, prefer],
                    "responses": {"200": job_ok, "400": ERROR_RESPONSE, "404": ERROR_RESPONSE},
                }
            },
            "/v1/jobs/{job_id}/cancel": {
                "post": {
                    "operationId": "cancelJob",
                    "summary": "Cancel a job; it ends as canceled within one decoding step",
                    "parameters": [job_id],
                    "responses": {
                        "200": {**job_ok, "description": "Canceled (or already finished)"},
                        "202": {**job_ok, "description": "Cancellation requested"},
                        "404": ERROR_RESPONSE,
                    },
                }
            },
            "/v1/jobs/{job_id}/events": {
                "get": {
                    "operationId": "streamJobEvents",
                    "summary": "Server-Sent Events: token events, then done",
                    "parameters": [
                        job_id,
                        {
                            "name": "after",
                            "in": "query",
                            "required": False,
                            "description": "resume after this token index",
                            "schema": {"type": "integer", "minimum": -1},
                        },
                        {
                            "name": "Last-Event-ID",
                            "in": "header",
                            "required": False,
                            "schema": {"type": "string"},
                        },
                    ],
                    "responses": {
                        "200": {
                            "description": "event: token (data {index, text}) ... event: done",
                            "content": {"text/event-stream": {"schema": {"type": "string"}}},
                        },
                        "400": ERROR_RESPONSE,
                        "404": ERROR_RESPONSE,
                    },
                }
            },
            "/healthz": {
                "get": {
                    "operationId": "healthz",
                    "responses": {"200": {"description": "The process is alive"}},
                }
            },
            "/readyz": {
                "get": {
                    "operationId": "readyz",
                    "responses": {
                        "200": {
                            "description": "Redis answers and a worker serves the default model"
                        },
                        "503": {"description": "Not ready; the body says why"},
                    },
                }
            },
        },
        "components": {
            "schemas": {
                "JobRequest": _job_request_schema(settings),
                "Job": _job_schema(),
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["type", "message"],
                            "properties": {
                                "type": {"type": "string"},
                                "message": {"type": "string"},
                                "param": {"type": "string", "nullable": True},
                            },
                        }
                    },
                },
            },
            "responses": {
                "Error": {
                    "description": "Error",
                    "content": {"application/json": {"schema": _ref("Error")}},
                }
            },
        },
        "x-limits": {
            "max_prompt_tokens": limits.max_prompt_tokens,
            "max_tokens_ceiling": limits.max_tokens_ceiling,
        },
    }


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _job_request_schema(settings: Settings) -> dict[str, Any]:
    limits = settings.limits
    stop_item = {"type": "string", "minLength": 1, "maxLength": limits.max_stop_chars}
    return {
        "type": "object",
        "required": ["prompt"],
        "additionalProperties": False,
        "properties": {
            "prompt": {"type": "string"},
            "model": {"type": "string", "enum": sorted(settings.models)},
            "max_tokens": {
                "type": "integer",
                "minimum": 1,
                "maximum": limits.max_tokens_ceiling,
                "default": limits.default_max_tokens,
            },
            "temperature": {"type": "number", "minimum": 0, "maximum": 2, "default": 1.0},
            "top_k": {"type": "integer", "minimum": 0, "maximum": 1000, "default": 0},
            "top_p": {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": 1},
            "stop": {
                "oneOf": [
                    stop_item,
                    {"type": "array", "items": stop_item, "maxItems": limits.max_stop_sequences},
                ]
            },
            "seed": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1, "nullable": True},
            "ignore_eos": {"type": "boolean", "default": False},
            "repetition_penalty": {
                "type": "number",
                "exclusiveMinimum": True,
                "minimum": 0,
                "maximum": 10,
                "default": 1.0,
            },
        },
    }


def _job_schema() -> dict[str, Any]:
    number = {"type": "number", "nullable": True}
    return {
        "type": "object",
        "required": ["id", "model", "status", "output", "usage", "metrics", "created_at"],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string", "enum": ["job"]},
            "model": {"type": "string"},
            "status": {"type": "string", "enum": [s.value for s in JobStatus]},
            "output": {"type": "string"},
            "finish_reason": {
                "type": "string",
                "nullable": True,
                "enum": [r.value for r in FinishReason],
            },
            "usage": {
                "type": "object",
                "properties": {
                    "prompt_tokens": {"type": "integer"},
                    "completion_tokens": {"type": "integer"},
                },
            },
            "metrics": {
                "type": "object",
                "properties": {
                    "queue_seconds": number,
                    "time_to_first_token_seconds": number,
                    "generation_seconds": number,
                    "tokens_per_second": number,
                },
            },
            "error": {
                "type": "object",
                "nullable": True,
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
            "params": {"type": "object"},
            "created_at": {"type": "number"},
            "started_at": number,
            "completed_at": number,
        },
    }
