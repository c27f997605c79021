"""The OpenAPI 3.1 description of every HTTP operation, served at ``/openapi.json``.

The paths are written here; every schema is generated from the classes that validate requests
(``web.request_models``, bound to the configuration's limits) and the types the response builders
return (``web.response_models``), so the document and the server cannot disagree. CI fuzzes the
running server from it (tests/system/test_schema_fuzz.py). The WebSocket route is described in the
job-events operation, since OpenAPI cannot express it.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter
from pydantic.json_schema import models_json_schema

from web.openapi_openai import openai_paths
from web.openapi_parts import JSON, SSE, body, links, ref, responses
from web.openapi_responses import responses_paths
from web.request_models import RequestModels
from web.response_models import RESPONSE_MODELS
from worker.config import Settings

REF_TEMPLATE = "#/components/schemas/{model}"


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


def openapi_document(settings: Settings, models: RequestModels | None = None) -> dict[str, Any]:
    models = models or RequestModels.bound_to(settings)
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
        "openapi": "3.1.0",
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
                    "summary": "Cancel a job; a running one ends after a token flush and a step",
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
            **openai_paths(),
            **responses_paths(),
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
            "schemas": {**component_schemas(models), "SseEvent": SSE_EVENT_SCHEMA},
            "responses": {
                "Error": {"description": "Error", "content": {JSON: {"schema": ref("Error")}}}
            },
        },
    }


def job_links(job_id: str, *operations: str) -> dict[str, Any]:
    """OpenAPI links to job operations, their ``job_id`` taken from ``job_id`` (an expression)."""
    return links("job_id", job_id, *operations)


def component_schemas(models: RequestModels) -> dict[str, Any]:
    """Request schemas (as validated) and response schemas (as serialized), with every nested
    model hoisted into ``components/schemas``."""
    _, requests = models_json_schema(
        [(model, "validation") for model in models.all()], ref_template=REF_TEMPLATE
    )
    schemas: dict[str, Any] = dict(requests.get("$defs", {}))
    for name, shape in RESPONSE_MODELS.items():
        schema = TypeAdapter(shape).json_schema(mode="serialization", ref_template=REF_TEMPLATE)
        for nested, definition in {**schema.pop("$defs", {}), name: schema}.items():
            # A request and a response model of one name would silently replace each other.
            if schemas.get(nested, definition) != definition:
                raise ValueError(f"two different schemas are named {nested!r}")
            schemas[nested] = definition
    return schemas
