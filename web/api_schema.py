"""The OpenAPI 3.1 description of every HTTP operation, served at ``/openapi.json``.

The paths are written here; every schema is generated from the classes that validate requests
(``web.common.request_models``, bound to the configuration's limits) and the types the response
builders return (``web.common.response_models`` and an API's own ``models``), so the document
and the server cannot disagree. CI fuzzes the running server from it
(tests/system/test_schema_fuzz.py). The WebSocket route is described in the job-events
operation, since OpenAPI cannot express it.
"""

from __future__ import annotations

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, models_json_schema

from trickle.config.settings import Settings
from web.anthropic import models as anthropic_models
from web.anthropic.schema import ERROR as ANTHROPIC_ERROR
from web.anthropic.schema import messages_paths
from web.batches.schema import batch_paths, file_paths
from web.common.openapi_parts import (
    SSE,
    SSE_EVENT_SCHEMA,
    Part,
    body,
    json_ok,
    json_or_events,
    links,
    optional_param,
    path_param,
    ref,
    reply,
    responses,
)
from web.common.request_models import RequestModels
from web.common.response_models import PUBLISHED_NAMES, RESPONSE_MODELS
from web.openai.responses_api.models import RESPONSES_RESPONSE_MODELS

REF_TEMPLATE = "#/components/schemas/{model}"


def openapi_document(settings: Settings, models: RequestModels | None = None) -> Part:
    models = models or RequestModels.bound_to(settings)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Trickle",
            "version": "0.1.0",
            "description": "Batch-and-stream text generation: submit, poll, wait or stream "
            "jobs, natively or through the OpenAI-compatible endpoints.",
        },
        "paths": {
            **_job_paths(settings.web.max_wait_seconds),
            **_openai_paths(),
            **_responses_paths(),
            **messages_paths(),
            **batch_paths(),
            **file_paths(),
            "/healthz": {
                "get": {
                    "operationId": "healthz",
                    "responses": {"200": json_ok("The process answers", {"type": "object"})},
                }
            },
            "/readyz": {
                "get": {
                    "operationId": "readyz",
                    "responses": {
                        "200": json_ok(
                            "Redis answers and a worker serves the default model, or an "
                            "autoscaler will start one (`workers` may be 0)",
                            {"type": "object"},
                        ),
                        "503": json_ok("Not ready; the body says why", {"type": "object"}),
                    },
                }
            },
        },
        "components": {
            "schemas": {
                **component_schemas(models, anthropic_models.messages_models(settings).all()),
                "SseEvent": SSE_EVENT_SCHEMA,
            },
            "responses": {
                "Error": json_ok("Error", ref("Error")),
                ANTHROPIC_ERROR: json_ok("Error", ref(ANTHROPIC_ERROR)),
            },
        },
    }


def _job_paths(max_wait_seconds: int) -> Part:
    job_id = path_param("job_id")
    prefer = optional_param(
        "header",
        "Prefer",
        {"type": "string", "example": "wait=10"},
        f"wait=N: wait up to N seconds (at most {max_wait_seconds}) for the job to finish",
    )
    cancel_after = optional_param(
        "header",
        "Cancel-After",
        {"type": "string", "example": "30s"},
        "a duration (30s, 1m30s, 500ms): a job not started by then is not run (expired), one "
        "running then is stopped with what it made (finish_reason deadline)",
    )
    stream_token = optional_param(
        "query",
        "token",
        {"type": "string"},
        "the read-only stream token of this job (in its urls.stream and urls.ws): reads the "
        "job without an API key; a bad or expired token is a 401",
    )
    resume = "resume after this token index"
    # Links let a stateful fuzzer walk sequences (submit -> get -> events -> cancel).
    from_body = links("job_id", "$response.body#/id", "getJob", "streamJobEvents", "cancelJob")
    from_path = links("job_id", "$request.path.job_id", "streamJobEvents", "cancelJob")
    submitted = {
        "200": json_ok("Finished within Prefer: wait", ref("Job"), from_body),
        "202": json_ok("Accepted: queued or running", ref("Job"), from_body),
    }
    canceled = {
        "200": json_ok("Canceled or already finished", ref("Job")),
        "202": json_ok("Cancellation requested", ref("Job")),
    }
    events = reply(
        "event: token ... event: done (or error)",
        {SSE: {"schema": ref("SseEvent")}},
        links("job_id", "$request.path.job_id", "cancelJob"),
    )
    return {
        "/v1/jobs": {
            "post": {
                "operationId": "submitJob",
                "summary": "Submit a generation job",
                "parameters": [prefer, cancel_after],
                "requestBody": body("JobRequest"),
                "responses": responses(submitted, 400, 404, 413, 429),
            }
        },
        "/v1/jobs/{job_id}": {
            "get": {
                "operationId": "getJob",
                "summary": "Read a job: the output so far, or the final result",
                "parameters": [job_id, prefer, stream_token],
                "responses": responses(
                    {"200": json_ok("The job", ref("Job"), from_path)}, 400, 404
                ),
            }
        },
        "/v1/jobs/{job_id}/cancel": {
            "post": {
                "operationId": "cancelJob",
                "summary": "Cancel a job; a running one ends after a token flush and a step",
                "parameters": [job_id],
                "responses": responses(canceled, 404),
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
                    optional_param("query", "after", {"type": "integer", "minimum": -1}, resume),
                    optional_param("header", "Last-Event-ID", {"type": "string"}, resume),
                ],
                "responses": responses({"200": events}, 400, 404),
            }
        },
    }


def _openai_paths() -> Part:
    def generated(schema: str) -> Part:
        description = "The result, or with stream: true an SSE stream of chunks ending with "
        return {"200": reply(description + "data: [DONE]", json_or_events(schema))}

    return {
        "/v1/models": {
            "get": {
                "operationId": "listModels",
                "responses": responses({"200": json_ok("Models", ref("ModelList"))}),
            }
        },
        "/v1/models/{model_id}": {
            "get": {
                "operationId": "getModel",
                "parameters": [path_param("model_id")],
                "responses": responses({"200": json_ok("A model", ref("Model"))}, 404),
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
        "/v1/chat/completions": {
            "post": {
                "operationId": "createChatCompletion",
                "summary": "OpenAI-compatible chat completion through the model's chat template",
                "requestBody": body("ChatCompletionRequest"),
                "responses": responses(generated("ChatCompletion"), 400, 404, 413, 429, 504),
            }
        },
    }


def _responses_paths() -> Part:
    response_id = path_param("response_id")
    from_body = links(
        "response_id", "$response.body#/id", "getResponse", "cancelResponse", "deleteResponse"
    )
    from_path = links("response_id", "$request.path.response_id", "cancelResponse")
    created = reply(
        "The response, or with stream: true its events (response.created ... "
        "response.completed), each numbered",
        json_or_events("Response"),
        from_body,
    )
    read = reply("The response, or its events", json_or_events("Response"), from_path)
    flag = {"type": "string", "enum": ["true", "false"]}
    return {
        "/v1/responses": {
            "post": {
                "operationId": "createResponse",
                "summary": "OpenAI's Responses API: a response is a Trickle job; with "
                "background: true it runs without the connection and its stream resumes",
                "requestBody": body("ResponseCreateRequest"),
                "responses": responses({"200": created}, 400, 404, 413, 429, 504),
            }
        },
        "/v1/responses/{response_id}": {
            "get": {
                "operationId": "getResponse",
                "summary": "A stored response; with stream=true its events after "
                "starting_after (waiting for those not known yet)",
                "parameters": [
                    response_id,
                    optional_param("query", "stream", flag),
                    optional_param(
                        "query",
                        "starting_after",
                        {"type": "integer", "minimum": 0},
                        "the sequence number of the last event already read",
                    ),
                    optional_param(
                        "query", "include_obfuscation", flag, "accepted; Trickle never pads"
                    ),
                ],
                "responses": responses({"200": read}, 400, 404),
            },
            "delete": {
                "operationId": "deleteResponse",
                "summary": "Forget a stored response (a running one is canceled)",
                "parameters": [response_id],
                "responses": responses({"200": json_ok("Deleted", ref("ResponseDeleted"))}, 404),
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


def component_schemas(models: RequestModels, more: tuple[type[BaseModel], ...] = ()) -> Part:
    """Request schemas (as validated) and response schemas (as serialized), with every nested
    model hoisted into ``components/schemas``; ``more``: other routes' request models (the
    Messages API's)."""
    _, requests = models_json_schema(
        [(model, "validation") for model in (*models.all(), *more)],
        ref_template=REF_TEMPLATE,
        schema_generator=PublishedNames,
    )
    schemas: Part = dict(requests.get("$defs", {}))
    for name, shape in {
        **RESPONSE_MODELS,
        **RESPONSES_RESPONSE_MODELS,
        **anthropic_models.ANTHROPIC_RESPONSE_MODELS,
    }.items():
        schema = TypeAdapter(shape).json_schema(
            mode="serialization", ref_template=REF_TEMPLATE, schema_generator=PublishedNames
        )
        for nested, definition in {**schema.pop("$defs", {}), name: schema}.items():
            # A request and a response model of one name would silently replace each other.
            if schemas.get(nested, definition) != definition:
                raise ValueError(f"two different schemas are named {nested!r}")
            schemas[nested] = definition
    return schemas


class PublishedNames(GenerateJsonSchema):
    """Pydantic's schemas, a class in ``PUBLISHED_NAMES`` hoisted under its published name."""

    def normalize_name(self, name: str) -> str:
        return super().normalize_name(PUBLISHED_NAMES.get(name, name))
