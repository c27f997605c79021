"""The OpenAPI 3 description of every HTTP operation, served at ``/openapi.json``.

Built from the same limits the validator enforces, so the document cannot promise more than the
server accepts; CI fuzzes the running server from it (tests/test_schema_fuzz.py). The WebSocket
route is described in the job-events operation, since OpenAPI cannot express it.
"""

from __future__ import annotations

from typing import Any

from web.openapi_openai import openai_paths, openai_schemas
from web.validation import MAX_REPETITION_PENALTY, MIN_REPETITION_PENALTY, MIN_TOP_P
from worker.config import Settings
from worker.jobs import FinishReason, JobStatus

JSON = "application/json"
SSE = "text/event-stream"


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


def openapi_document(settings: Settings) -> dict[str, Any]:
    job_id = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
    prefer = {
        "name": "Prefer",
        "in": "header",
        "required": False,
        "description": "wait=N: wait up to N seconds (at most "
        f"{settings.web.max_wait_seconds}) for the job to finish",
        "schema": {"type": "string", "example": "wait=10"},
    }
    stream_token = {
        "name": "token",
        "in": "query",
        "required": False,
        "description": "the read-only stream token of this job (in its urls.stream and "
        "urls.ws): reads the job without an API key; a bad or expired token is a 401",
        "schema": {"type": "string"},
    }
    job = {JSON: {"schema": ref("Job")}}
    # Links let a stateful fuzzer walk sequences (submit -> get -> events -> cancel).
    from_body = job_links("$response.body#/id", "getJob", "streamJobEvents", "cancelJob")
    from_path = job_links("$request.path.job_id", "streamJobEvents", "cancelJob")
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "Trickle",
            "version": "0.1.0",
            "description": "Batch-and-stream text generation: submit, poll, wait or stream "
            "jobs, natively or through the OpenAI-compatible endpoints.",
        },
        "paths": {
            "/v1/jobs": {
                "post": {
                    "operationId": "submitJob",
                    "summary": "Submit a generation job",
                    "parameters": [prefer],
                    "requestBody": body("JobRequest"),
                    "responses": responses(
                        {
                            "200": {
                                "description": "Finished within Prefer: wait",
                                "content": job,
                                "links": from_body,
                            },
                            "202": {
                                "description": "Accepted: queued or running",
                                "content": job,
                                "links": from_body,
                            },
                        },
                        400,
                        404,
                        413,
                        429,
                    ),
                }
            },
            "/v1/jobs/{job_id}": {
                "get": {
                    "operationId": "getJob",
                    "summary": "Read a job: the output so far, or the final result",
                    "parameters": [job_id, prefer, stream_token],
                    "responses": responses(
                        {"200": {"description": "The job", "content": job, "links": from_path}},
                        400,
                        404,
                    ),
                }
            },
            "/v1/jobs/{job_id}/cancel": {
                "post": {
                    "operationId": "cancelJob",
                    "summary": "Cancel a job; a running one ends within one decoding step",
                    "parameters": [job_id],
                    "responses": responses(
                        {
                            "200": {"description": "Canceled or already finished", "content": job},
                            "202": {"description": "Cancellation requested", "content": job},
                        },
                        404,
                    ),
                }
            },
            "/v1/jobs/{job_id}/events": {
                "get": {
                    "operationId": "streamJobEvents",
                    "summary": "Server-Sent Events: one token event per token, a status event "
                    "on every change (queued with position, running, the final state), then "
                    "done. The same events are served as JSON messages over WebSocket at "
                    "/v1/jobs/{job_id}/ws (?after=n resumes, ?token= opens it without a key).",
                    "parameters": [
                        job_id,
                        stream_token,
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
                            "description": "resume after this token index",
                            "schema": {"type": "string"},
                        },
                    ],
                    "responses": responses(
                        {
                            "200": {
                                "description": "event: token ... event: done (or error)",
                                "content": {SSE: {"schema": ref("SseEvent")}},
                                "links": job_links("$request.path.job_id", "cancelJob"),
                            }
                        },
                        400,
                        404,
                    ),
                }
            },
            **openai_paths(responses, body, ref),
            "/healthz": {
                "get": {
                    "operationId": "healthz",
                    "responses": {
                        "200": {
                            "description": "The process answers",
                            "content": {JSON: {"schema": {"type": "object"}}},
                        }
                    },
                }
            },
            "/readyz": {
                "get": {
                    "operationId": "readyz",
                    "responses": {
                        "200": {
                            "description": "Redis answers and a worker serves the default "
                            "model, or an autoscaler will start one (`workers` may be 0)",
                            "content": {JSON: {"schema": {"type": "object"}}},
                        },
                        "503": {
                            "description": "Not ready; the body says why",
                            "content": {JSON: {"schema": {"type": "object"}}},
                        },
                    },
                }
            },
        },
        "components": {
            "schemas": {
                "JobRequest": _job_request_schema(settings),
                "Job": _job_schema(),
                "Error": _error_schema(),
                "SseEvent": SSE_EVENT_SCHEMA,
                **openai_schemas(settings),
            },
            "responses": {
                "Error": {"description": "Error", "content": {JSON: {"schema": ref("Error")}}}
            },
        },
    }


def job_links(job_id: str, *operations: str) -> dict[str, Any]:
    """OpenAPI links to job operations, their ``job_id`` taken from ``job_id`` (an expression)."""
    return {
        operation[0].upper() + operation[1:]: {
            "operationId": operation,
            "parameters": {"job_id": job_id},
        }
        for operation in operations
    }


def sampling_properties(settings: Settings) -> dict[str, Any]:
    """Fields shared by the job API and the OpenAI-compatible API (web.validation)."""
    limits = settings.limits
    stop_item = {"type": "string", "minLength": 1, "maxLength": limits.max_stop_chars}
    return {
        "model": {"type": "string", "enum": sorted(settings.models)},
        "max_tokens": {
            "type": "integer",
            "minimum": 1,
            "maximum": limits.max_tokens_ceiling,
            "nullable": True,
        },
        "temperature": {"type": "number", "minimum": 0, "maximum": 2, "nullable": True},
        "top_k": {"type": "integer", "minimum": 0, "maximum": 1000, "nullable": True},
        "top_p": {"type": "number", "minimum": MIN_TOP_P, "maximum": 1, "nullable": True},
        "stop": {
            "nullable": True,
            "oneOf": [
                stop_item,
                {"type": "array", "items": stop_item, "maxItems": limits.max_stop_sequences},
            ],
        },
        "seed": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1, "nullable": True},
        "ignore_eos": {"type": "boolean", "nullable": True},
        "repetition_penalty": {
            "type": "number",
            "minimum": MIN_REPETITION_PENALTY,
            "maximum": MAX_REPETITION_PENALTY,
            "nullable": True,
        },
    }


def _job_request_schema(settings: Settings) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["prompt"],
        "additionalProperties": False,
        "properties": {
            "prompt": {"type": "string"},
            "webhook_url": {
                "type": "string",
                "nullable": True,
                "description": "POST the finished job here (host must be allowlisted)",
            },
            **sampling_properties(settings),
        },
    }


def _error_schema() -> dict[str, Any]:
    nullable_string = {"type": "string", "nullable": True}
    return {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {
                    "type": {"type": "string"},
                    "message": {"type": "string"},
                    "param": nullable_string,
                    "code": nullable_string,
                },
            }
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
                "required": ["prompt_tokens", "completion_tokens"],
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
            "attempts": {"type": "integer"},
            "urls": {
                "type": "object",
                "description": "Absolute URLs of the job (job API responses): stream and ws "
                "carry a read-only token for this job alone, valid for the result TTL",
                "required": ["self", "cancel", "stream", "ws"],
                "properties": {
                    "self": {"type": "string", "format": "uri"},
                    "cancel": {"type": "string", "format": "uri"},
                    "stream": {"type": "string", "format": "uri"},
                    "ws": {"type": "string", "format": "uri"},
                },
            },
        },
    }
