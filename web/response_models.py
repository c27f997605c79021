"""The response bodies as typed dictionaries: the builders return them (mypy checks the shape)
and ``web.openapi`` generates the response schemas from the same types."""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from typing_extensions import TypedDict

# Shared with the job contract: web.openapi generates the Job schema from it.
from worker.jobs import JobObject as JobObject


class JobUrls(TypedDict):
    """Absolute URLs of a job: stream and ws carry a read-only token for it alone."""

    self: str
    cancel: str
    stream: str
    ws: str


class JobWithUrls(JobObject, total=False):
    """The job object as the job API answers it (stream events carry it without ``urls``)."""

    urls: JobUrls


class ErrorDetail(TypedDict):
    message: str
    type: str
    param: str | None
    code: str | None
    # A 503 after jobs were created names them, so the client can follow them.
    job_ids: NotRequired[list[str]]


class ErrorBody(TypedDict):
    error: ErrorDetail


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(TypedDict):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: Literal["stop", "length"] | None


class AssistantMessage(TypedDict):
    role: Literal["assistant"]
    content: str


class ChatChoice(TypedDict):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None
    finish_reason: Literal["stop", "length"]


class Envelope(TypedDict):
    id: str
    object: str
    created: int
    model: str
    system_fingerprint: None
    job_ids: list[str]


class Completion(Envelope):
    choices: list[CompletionChoice]
    usage: Usage


class ChatCompletion(Envelope):
    choices: list[ChatChoice]
    usage: Usage


class Model(TypedDict):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    default: bool
    workers: int
    max_context_tokens: int
    max_prompt_tokens: int
    max_tokens: int


class ModelList(TypedDict):
    object: Literal["list"]
    data: list[Model]


class RequestCounts(TypedDict):
    total: int
    completed: int
    failed: int


class Batch(TypedDict):
    id: str
    object: Literal["batch"]
    endpoint: str
    completion_window: str
    status: Literal["in_progress", "completed", "cancelling", "cancelled"]
    created_at: int
    cancelled_at: int | None
    request_counts: RequestCounts
    output_url: str


RESPONSE_MODELS: dict[str, Any] = {
    "Job": JobWithUrls,
    "Error": ErrorBody,
    "Completion": Completion,
    "ChatCompletion": ChatCompletion,
    "Model": Model,
    "ModelList": ModelList,
    "Batch": Batch,
}
