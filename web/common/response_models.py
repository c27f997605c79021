"""The response bodies as typed dictionaries: the builders return them (mypy checks the shape)
and ``web.api_schema`` generates the response schemas from the same types."""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

# Shared with the job contract: web.api_schema generates the Job schema from it.
from trickle.jobs import JobObject as JobObject


class JobUrls(TypedDict):
    """Absolute URLs of a job: stream and ws carry a read-only token for it alone."""

    self: str
    cancel: str
    stream: str
    ws: str


class Queued(TypedDict):
    """Where a queued job stands: queued jobs ahead of it, and seconds until it is expected to
    start (null: unknown, e.g. no live worker serves its model)."""

    position: int | None
    eta_seconds: float | None


class JobWithUrls(JobObject, total=False):
    """The job object as the job API answers it (stream events carry it without ``urls``)."""

    urls: JobUrls


class JobAnswer(JobWithUrls, total=False):
    """What the job API answers: ``queued`` only on a read of a queued job."""

    queued: Queued


class ErrorDetail(TypedDict):
    message: str
    type: str
    param: str | None
    code: str | None
    # A 503 after jobs were created names them, so the client can follow them.
    job_ids: NotRequired[list[str]]


class ErrorBody(TypedDict):
    error: ErrorDetail


# A completion's token counts (trickle.jobs.Usage holds a job's), published as Usage. A comment,
# not a docstring: pydantic would publish a docstring as the schema's description.
@with_config(ConfigDict(title="Usage"))
class CompletionUsage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(TypedDict):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: Literal["stop", "length"] | None


class MessageFunction(TypedDict):
    name: str
    arguments: str


class MessageToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: MessageFunction


class AssistantMessage(TypedDict):
    role: Literal["assistant"]
    content: str | None


class AssistantToolMessage(AssistantMessage):
    """An answer that called tools (``content`` null when it wrote nothing else)."""

    tool_calls: list[MessageToolCall]


class ChatChoice(TypedDict):
    index: int
    message: AssistantMessage | AssistantToolMessage
    logprobs: dict[str, Any] | None
    finish_reason: Literal["stop", "length", "tool_calls"]


class CompletionEnvelope(TypedDict):
    """The fields a completion and a chat completion share (``web.openai.responses.Envelope``
    holds their values for one response)."""

    id: str
    object: str
    created: int
    model: str
    system_fingerprint: None
    job_ids: list[str]


class Completion(CompletionEnvelope):
    choices: list[CompletionChoice]
    usage: CompletionUsage


class ChatCompletion(CompletionEnvelope):
    choices: list[ChatChoice]
    usage: CompletionUsage


class Model(TypedDict):
    """OpenAI's model object and Anthropic's (``type``, ``display_name``, ``created_at``) in one:
    each client reads its own fields and ignores the others."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    type: Literal["model"]
    display_name: str
    created_at: str
    default: bool
    workers: int
    max_context_tokens: int
    max_prompt_tokens: int
    max_tokens: int


class ModelList(TypedDict):
    """OpenAI's list, with Anthropic's page fields (one page holds every model)."""

    object: Literal["list"]
    data: list[Model]
    has_more: bool
    first_id: str | None
    last_id: str | None


class RequestCounts(TypedDict):
    total: int
    completed: int
    failed: int


BatchStatus = Literal[
    "validating",
    "in_progress",
    "finalizing",
    "completed",
    "failed",
    "expired",
    "cancelling",
    "cancelled",
]


class BatchError(TypedDict):
    code: str
    message: str
    param: str | None
    line: int | None


class BatchErrors(TypedDict):
    object: Literal["list"]
    data: list[BatchError]


class Batch(TypedDict):
    """OpenAI's batch object, plus ``output_url`` (the output so far, as JSONL)."""

    id: str
    object: Literal["batch"]
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str | None
    completion_window: str
    status: BatchStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None
    output_url: str
    # While its first waiting job is queued: where that one stands (the batch's next start).
    queued: NotRequired[Queued]


class BatchList(TypedDict):
    object: Literal["list"]
    data: list[Batch]
    first_id: str | None
    last_id: str | None
    has_more: bool


FilePurpose = Literal["batch", "batch_output", "user_data"]


class FileObject(TypedDict):
    """OpenAI's file object."""

    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: FilePurpose
    status: Literal["processed"]
    status_details: None


class FileList(TypedDict):
    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(TypedDict):
    id: str
    object: Literal["file"]
    deleted: bool


# Schemas published under another name than their class's: a component's name is API (clients
# generate types from it), so a class renamed in Python keeps the name it was published under.
PUBLISHED_NAMES = {"CompletionUsage": "Usage", "FileObject": "File"}

RESPONSE_MODELS: dict[str, Any] = {
    "Job": JobAnswer,
    "Error": ErrorBody,
    "Completion": Completion,
    "ChatCompletion": ChatCompletion,
    "Model": Model,
    "ModelList": ModelList,
    "Batch": Batch,
    "BatchList": BatchList,
    "File": FileObject,
    "FileList": FileList,
    "FileDeleted": FileDeleted,
}
